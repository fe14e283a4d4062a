"""The live status page on the metrics port (`--allow-status-page`, docs/status-page.md).

`GET /` answers the page, `GET /status.css` and `/status.js` its style and script, and
`GET /status.json` the document the script polls every second (frontends/metrics/status.py).
The three files ship as package data (oceanus/frontends/metrics/static/): plain HTML, CSS and
JavaScript drawing SVG, nothing fetched from elsewhere and nothing to build.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib import resources

import orjson

from oceanus.frontends.metrics.status import StatusSource

# path -> (file under static/, content type)
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/status.css": ("status.css", "text/css; charset=utf-8"),
    "/status.js": ("status.js", "text/javascript; charset=utf-8"),
}
JSON_PATH = "/status.json"
# The page loads nothing but its own files and its own JSON.
SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
)


@dataclass(frozen=True)
class Reply:
    content_type: str
    body: bytes


def load_assets() -> dict[str, Reply]:
    """The page's files, read once from the package."""
    folder = resources.files("oceanus.frontends.metrics").joinpath("static")
    return {
        path: Reply(content_type, folder.joinpath(name).read_bytes())
        for path, (name, content_type) in ASSETS.items()
    }


class StatusPage:
    def __init__(self, source: StatusSource) -> None:
        self.source = source
        self.assets = load_assets()

    def serves(self, path: str) -> bool:
        return path == JSON_PATH or path in self.assets

    async def reply(self, path: str) -> Reply:
        if path != JSON_PATH:
            return self.assets[path]
        # /proc reads off the loop; the statistics themselves are read on it, where they change.
        await asyncio.get_running_loop().run_in_executor(None, self.source.refresh)
        body = orjson.dumps(self.source.document(), option=orjson.OPT_SERIALIZE_NUMPY)
        return Reply("application/json", body)
