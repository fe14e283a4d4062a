"""Which LoRA adapters a model loads at start, from model.json (torch-free, as args.py).

Two ways, merged: Triton's vLLM backend reads `multi_lora.json` beside model.json when
`enable_lora` is true ({"name": "folder", ...}); vLLM's server takes `lora_modules` (here a
model.json key, as `oceanus serve --lora-modules` writes it): "name=folder" strings or
{"name", "path", "base_model_name"} objects. Relative folders are resolved against the version
folder; a missing one fails the load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oceanus.core.errors import invalid_arg

MULTI_LORA = "multi_lora.json"


def _enabled(raw: dict[str, Any]) -> bool:
    return str(raw.get("enable_lora", False)).lower() == "true"


def _entries(raw: dict[str, Any], version_dir: Path, path: Path) -> list[tuple[str, str]]:
    entries: list[tuple[str, str]] = []
    multi = version_dir / MULTI_LORA
    if _enabled(raw) and multi.is_file():
        try:
            document = json.loads(multi.read_text())
        except ValueError as exc:
            raise invalid_arg(f"{multi}: not valid JSON: {exc}") from None
        if not isinstance(document, dict) or not all(isinstance(v, str) for v in document.values()):
            raise invalid_arg(f"{multi}: a JSON object of adapter name -> folder is required")
        entries += list(document.items())
    modules = raw.get("lora_modules") or []
    if not isinstance(modules, list):
        raise invalid_arg(f"{path}: 'lora_modules' must be a list")
    for item in modules:
        if isinstance(item, str) and "=" in item:
            name, _, folder = item.partition("=")
            entries.append((name, folder))
        elif isinstance(item, dict) and isinstance(item.get("name"), str) and item.get("path"):
            entries.append((item["name"], str(item["path"])))
        else:
            raise invalid_arg(
                f"{path}: each 'lora_modules' entry is 'name=path' or "
                f'{{"name": ..., "path": ...}}, got {item!r}'
            )
    return entries


def lora_modules(
    raw: dict[str, Any], version_dir: Path, path: Path
) -> tuple[tuple[str, Path], ...]:
    """The adapters to load at start, each (name, an existing folder)."""
    found: dict[str, Path] = {}
    for name, folder in _entries(raw, version_dir, path):
        if not name:
            raise invalid_arg(f"{path}: a LoRA adapter needs a name")
        if name in found:
            raise invalid_arg(f"{path}: LoRA adapter '{name}' is named twice")
        candidate = Path(folder).expanduser()
        if not candidate.is_absolute():
            candidate = version_dir / candidate
        if not candidate.is_dir():
            raise invalid_arg(
                f"LoRA adapter '{name}': no such folder {folder} (absolute, or relative to "
                f"the version folder {version_dir})"
            )
        found[name] = candidate
    return tuple(found.items())
