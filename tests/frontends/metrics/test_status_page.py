"""The live status page on the metrics port, in a real headless Chromium: it lists the models,
follows load (request rate, batch sizes, latency, failures, cache) and fits a phone and a
desktop window. Plus `/status.json` itself and `--allow-status-page=false`."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import TEST_MODELS
from tests.frontends.metrics import browser as chromium_browser

BROKEN = "broken_model_whose_name_is_long_enough_to_wrap_on_a_phone_screen"
CACHED = "simple_cached"
LLM = "llm_tiny"  # served when the llm extra is installed (torch, transformers)
HAVE_LLM = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
# Screenshots land here too when it is set (docs/status-page.md's pictures are made this way).
SCREENSHOT_DIR = os.environ.get("OCEANUS_SCREENSHOT_DIR", "")


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


@pytest.fixture(scope="module")
def status_repository(model_repository: Path, tmp_path_factory: Any) -> Path:
    """The small example models, one copy of `simple` that uses the response cache, one
    model that fails to load, naming an input its file does not have (its long name and error
    must wrap, not overflow), and the tiny language model when the llm extra is there."""
    root = tmp_path_factory.mktemp("status-repo")
    for name in TEST_MODELS:
        (root / name).symlink_to(model_repository / name, target_is_directory=True)
    shutil.copytree(model_repository / "simple", root / CACHED)
    config = (root / CACHED / "config.pbtxt").read_text()
    config = config.replace('name: "simple"', f'name: "{CACHED}"')
    (root / CACHED / "config.pbtxt").write_text(config + "\nresponse_cache { enable: true }\n")
    (root / BROKEN / "1").mkdir(parents=True)
    shutil.copy(model_repository / "simple" / "1" / "model.onnx", root / BROKEN / "1")
    (root / BROKEN / "config.pbtxt").write_text(
        f'name: "{BROKEN}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "NOT_AN_INPUT" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
    )
    if HAVE_LLM:
        from oceanus.examples.llm import write_llm_model

        write_llm_model(root, LLM)
    return root


@pytest.fixture(scope="module")
def status_server(launch_module: Any, status_repository: Path) -> Any:
    return launch_module(
        [status_repository],
        [
            "--exit-on-error=false",
            "--strict-readiness=false",
            "--cache-config=local,size=1048576",
        ],
    )


def simple_inputs(rows: int) -> list[httpclient.InferInput]:
    data = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(data, binary_data=True)
        inputs.append(tensor)
    return inputs


class Load:
    """Requests to `simple_dyna` from a few threads until stopped: one row each, and every
    fifth request four rows (so that a batch of at least four always executes)."""

    def __init__(self, url: str, threads: int = 3) -> None:
        self.url = url
        self.stop_event = threading.Event()
        self.sent = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url)
        one, four = simple_inputs(1), simple_inputs(4)
        count = 0
        while not self.stop_event.is_set():
            client.infer("simple_dyna", four if count % 5 == 4 else one)
            count += 1
            self.sent += 1
        client.close()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium_browser.require()
    with chromium_browser.chromium() as driver:
        yield driver


def card_text(driver: Any, model: str, field: str) -> str:
    return str(
        driver.execute_script(
            "const n = document.querySelector(`[data-model='${arguments[0]}'] "
            "[data-field='${arguments[1]}']`); return n ? n.textContent : null;",
            model,
            field,
        )
    )


def batch_bars(driver: Any, model: str) -> dict[str, int]:
    bars = driver.execute_script(
        "return [...document.querySelectorAll(`[data-model='${arguments[0]}'] .hist-bar`)]"
        ".map(b => [b.dataset.size, Number(b.dataset.count)]);",
        model,
    )
    return {size: count for size, count in bars}


def sparkline_points(driver: Any, model: str) -> int:
    points = driver.execute_script(
        "const n = document.querySelector(`[data-model='${arguments[0]}'] .spark polyline`);"
        "return n ? n.getAttribute('points') || '' : '';",
        model,
    )
    return len(str(points).split())


def wait_for(driver: Any, condition: Any, timeout: float = 60.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.25).until(lambda d: condition(d))


def rate_of(driver: Any, model: str) -> float:
    text = card_text(driver, model, "rate")
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return -1.0


# What sticks out of the window: the page's own width, then every displayed element's box.
OVERFLOW_SCRIPT = """
const width = document.documentElement.clientWidth;
const out = [];
const page = document.documentElement.scrollWidth;
if (page > width) out.push(['page', page, width]);
for (const node of document.querySelectorAll('body *')) {
  const box = node.getBoundingClientRect();
  if (box.width === 0 && box.height === 0) continue;  // not displayed
  if (box.left < -0.5 || box.right > width + 0.5) {
    out.push([node.tagName, node.textContent.slice(0, 40), box.left, box.right, width]);
  }
}
return out;
"""


# ---- /status.json and the flag ----------------------------------------------------------------


def test_page_and_document_are_served(status_server: Any) -> None:
    status, headers, body = get(status_server.metrics_port, "/")
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    assert b'src="status.js"' in body and b'href="status.css"' in body
    assert "default-src 'none'" in headers["content-security-policy"]
    for path, kind in (("/status.js", "text/javascript"), ("/status.css", "text/css")):
        status, headers, body = get(status_server.metrics_port, path)
        assert status == 200 and headers["content-type"].startswith(kind) and body
    status, headers, body = get(status_server.metrics_port, "/status.json")
    assert status == 200 and headers["content-type"] == "application/json"
    document = orjson.loads(body)
    models = {m["name"]: m for m in document["models"]}
    assert set(TEST_MODELS) | {CACHED, BROKEN} <= set(models)
    assert models["simple_dyna"]["dynamic_batching"] is True
    assert models["simple_dyna"]["instances"] == [{"kind": "KIND_CPU", "count": 2}]
    assert models[BROKEN]["state"] == "UNAVAILABLE"
    assert "unexpected inference input 'NOT_AN_INPUT'" in models[BROKEN]["reason"]
    assert models[CACHED]["stats"]["cache"] == {"hits": 0, "misses": 0}
    assert models["simple"]["stats"]["cache"] is None
    assert document["process"]["processes"] >= 1
    assert document["process"]["rss_bytes"] > 0
    assert set(document["connections"]) == {"http", "grpc"}
    # /metrics is unchanged beside it
    status, headers, body = get(status_server.metrics_port, "/metrics")
    assert status == 200 and b"nv_inference_request_success" in body


def test_document_counts_what_the_statistics_extension_counts(status_server: Any) -> None:
    client = httpclient.InferenceServerClient(status_server.http_url)
    get(status_server.metrics_port, "/status.json")  # the page is watching from now on
    for rows in (1, 2, 3):
        client.infer("simple", simple_inputs(rows))
    with pytest.raises(InferenceServerException):
        client.infer("simple", simple_inputs(9))  # over max_batch_size: refused, not counted
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    simple = next(
        m
        for m in orjson.loads(get(status_server.metrics_port, "/status.json")[2])["models"]
        if m["name"] == "simple"
    )["stats"]
    assert simple["success"] == stats["inference_stats"]["success"]["count"] >= 3
    assert simple["execution_count"] == stats["execution_count"]
    assert simple["ns"]["queue"] == stats["inference_stats"]["queue"]["ns"]
    assert simple["batches"] == {
        str(b["batch_size"]): b["compute_infer"]["count"] for b in stats["batch_stats"]
    }
    assert (
        simple["latency"]["p50_us"] > 0
        and simple["latency"]["p99_us"] >= simple["latency"]["p50_us"]
    )
    client.close()


def test_allow_status_page_false_answers_as_triton(launch: Any, model_repository: Path) -> None:
    server = launch(
        [model_repository],
        ["--allow-status-page=false", "--model-control-mode=explicit", "--load-model=simple"],
    )
    for path in ("/", "/status.json", "/status.js"):
        status, _, body = get(server.metrics_port, path)
        assert (status, body) == (200, b"")
    status, _, body = get(server.metrics_port, "/metrics")
    assert status == 200 and b"nv_inference_request_success" in body


# ---- in the browser ---------------------------------------------------------------------------


def test_browser_lists_models_and_follows_load(status_server: Any, browser: Any) -> None:
    browser.set_window_size(1280, 900)
    browser.get(f"http://127.0.0.1:{status_server.metrics_port}/")
    wait_for(browser, lambda d: card_text(d, "simple_dyna", "state") == "READY")
    for name in TEST_MODELS:
        assert card_text(browser, name, "state") == "READY", name
    assert card_text(browser, BROKEN, "state") == "UNAVAILABLE"
    assert card_text(browser, BROKEN, "reason")
    assert rate_of(browser, "simple_dyna") == 0.0

    with Load(status_server.http_url) as load:
        wait_for(browser, lambda d: rate_of(d, "simple_dyna") > 0 and load.sent > 0)
        # a batch of at least four rows executed, and the histogram shows it
        wait_for(
            browser,
            lambda d: any(
                count > 0
                for size, count in batch_bars(d, "simple_dyna").items()
                if int(size.split("-")[0]) >= 4
            ),
        )
        before = sum(batch_bars(browser, "simple_dyna").values())
        wait_for(browser, lambda d: sum(batch_bars(d, "simple_dyna").values()) != before)
        assert card_text(browser, "simple_dyna", "p99").endswith(("µs", "ms", "s"))
        assert card_text(browser, "simple_dyna", "time-compute_infer").endswith(("µs", "ms"))
        assert int(browser.find_element("id", "connections").text.replace(",", "")) >= 1
    # load over: the rate falls back to zero while the page keeps polling
    wait_for(browser, lambda d: rate_of(d, "simple_dyna") == 0.0)


def test_browser_shows_the_cache_hit_rate(status_server: Any, browser: Any) -> None:
    browser.set_window_size(1280, 900)
    browser.get(f"http://127.0.0.1:{status_server.metrics_port}/")
    client = httpclient.InferenceServerClient(status_server.http_url)
    for _ in range(3):  # the first misses, the next two hit
        client.infer(CACHED, simple_inputs(2))
    client.close()
    wait_for(browser, lambda d: "hit rate 66.7 %" in card_text(d, CACHED, "cache"))
    assert "2 hits, 1 misses" in card_text(browser, CACHED, "cache")
    assert card_text(browser, "simple", "cache") == ""  # no cache, no line


def generate(url: str, prompt: str) -> None:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    params = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    body = json.dumps({"text_input": prompt, **params})
    connection.request("POST", f"/v2/models/{LLM}/generate", body)
    response = connection.getresponse()
    assert response.status == 200, response.read()
    response.read()
    connection.close()


def test_browser_shows_a_language_models_tokens_and_token_times(
    status_server: Any, browser: Any
) -> None:
    if not HAVE_LLM:
        pytest.skip("the llm extra (torch, transformers) is not installed")
    browser.set_window_size(1280, 900)
    browser.get(f"http://127.0.0.1:{status_server.metrics_port}/")
    wait_for(browser, lambda d: card_text(d, LLM, "state") == "READY")
    # other models have no such figures: their boxes are not displayed
    hidden = "return document.querySelector(`[data-model='simple'] [data-field='tokens-rate']`)"
    assert browser.execute_script(hidden + ".offsetParent === null;")

    def tokens_per_s(driver: Any) -> float:
        generate(status_server.http_url, "The ocean covers")  # keep tokens coming
        try:
            return float(card_text(driver, LLM, "tokens-rate").replace(",", ""))
        except ValueError:
            return -1.0

    wait_for(browser, lambda d: tokens_per_s(d) > 0)
    for field in ("ttft", "tpot"):
        assert card_text(browser, LLM, field).endswith(("µs", "ms", "s")), field
    # The page shows the last poll's figures: one taken while a request ran says "1 · 0"; the
    # engine's gauges must come back to none running and none waiting.
    wait_for(browser, lambda d: card_text(d, LLM, "sequences") == "0 · 0")
    assert "prompt" in card_text(browser, LLM, "llm-note")


@pytest.mark.parametrize(
    "name, width, height", [("phone", 390, 844), ("desktop", 1280, 900)], ids=["phone", "desktop"]
)
def test_nothing_overflows(
    status_server: Any, browser: Any, name: str, width: int, height: int, tmp_path: Path
) -> None:
    """Under load (every section of the busy cards drawn), nothing is wider than the window."""
    client = httpclient.InferenceServerClient(status_server.http_url)
    for rows in (1, 2, 4):
        client.infer("simple", simple_inputs(rows))
    client.close()
    browser.set_window_size(width, height)
    browser.get(f"http://127.0.0.1:{status_server.metrics_port}/")
    with Load(status_server.http_url):
        wait_for(browser, lambda d: rate_of(d, "simple_dyna") > 0)
        wait_for(browser, lambda d: card_text(d, "simple_dyna", "p99").endswith("s"))
        # a few polls under load: the sparkline has a line to draw
        wait_for(browser, lambda d: sparkline_points(d, "simple_dyna") >= 4)
        overflow = browser.execute_script(OVERFLOW_SCRIPT)
        picture = tmp_path / f"status-page-{name}.png"
        assert browser.save_screenshot(str(picture))
    assert overflow == []
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SCREENSHOT_DIR:
        shutil.copy(picture, Path(SCREENSHOT_DIR) / picture.name)
