"""The example model registry, repository writer and on-disk cache."""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx

from . import resnet, small_models, text_classifier

# Bump whenever any generated file changes, so stale cached repositories are not reused.
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class ExampleModel:
    name: str
    config: str  # config.pbtxt text
    build: Callable[[], onnx.ModelProto]


def _registry() -> dict[str, ExampleModel]:
    models = [
        ExampleModel(resnet.NAME, resnet.CONFIG, resnet.build),
        ExampleModel(text_classifier.NAME, text_classifier.CONFIG, text_classifier.build),
        ExampleModel("simple", small_models.SIMPLE_CONFIG, small_models.build_simple),
        ExampleModel("simple_dyna", small_models.SIMPLE_DYNA_CONFIG, small_models.build_simple),
        ExampleModel("slow_fp32", small_models.SLOW_CONFIG, small_models.build_slow),
    ]
    for suffix in small_models.IDENTITY_TYPES:
        models.append(ExampleModel(
            small_models.identity_name(suffix),
            small_models.identity_config(suffix),
            functools.partial(small_models.build_identity, suffix),
        ))
    return {m.name: m for m in models}


MODELS: dict[str, ExampleModel] = _registry()
EXAMPLE_MODELS: tuple[str, ...] = tuple(MODELS)
LARGE_MODELS: tuple[str, ...] = (resnet.NAME, text_classifier.NAME)
SMALL_MODELS: tuple[str, ...] = tuple(n for n in EXAMPLE_MODELS if n not in LARGE_MODELS)


def _select(models: Iterable[str] | None) -> list[str]:
    """Validate and de-duplicate *models*, keeping EXAMPLE_MODELS order (None = all)."""
    if models is None:
        return list(EXAMPLE_MODELS)
    wanted = set(models)
    unknown = sorted(wanted - set(EXAMPLE_MODELS))
    if unknown:
        raise ValueError(
            f"unknown example model(s) {', '.join(unknown)}; "
            f"choose from {', '.join(EXAMPLE_MODELS)}"
        )
    return [name for name in EXAMPLE_MODELS if name in wanted]


def write_example_repository(
    path: str | os.PathLike[str], models: Iterable[str] | None = None
) -> pathlib.Path:
    """Write ``<path>/<model>/config.pbtxt`` and ``<path>/<model>/1/model.onnx`` per model."""
    root = pathlib.Path(path)
    for name in _select(models):
        model = MODELS[name]
        version_dir = root / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(model.config, encoding="utf-8")
        (version_dir / "model.onnx").write_bytes(model.build().SerializeToString())
    return root


def cache_root() -> pathlib.Path:
    env = os.environ.get("OCEANUS_CACHE_DIR")
    base = pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "oceanus"
    return base / "example-repositories"


def example_repository(models: Iterable[str] | None = None) -> pathlib.Path:
    """Return a cached, complete example repository holding *models* (all by default).

    The first caller generates it in a temporary sibling directory and renames it into
    place; rename is atomic, so concurrent callers (pytest-xdist workers, two servers) see
    either no directory or a complete one, never a half-written repository.
    """
    names = _select(models)
    key = hashlib.sha256(",".join(names).encode()).hexdigest()[:16]
    final = cache_root() / f"v{GENERATOR_VERSION}-{key}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write_example_repository(tmp, names)
        # Readable by other users, like a normal directory (mkdtemp creates it 0700).
        tmp.chmod(0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process won the race (the target exists and is not empty); use its copy.
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
