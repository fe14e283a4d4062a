"""The example model registry, repository writer and on-disk cache."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import onnx

from . import openvino_models, resnet, small_models, text_classifier, torch_models

log = logging.getLogger("oceanus.examples")

# Bump whenever any generated file changes, so stale cached repositories are not reused.
GENERATOR_VERSION = 3  # 3: the big models ask for no instance kind (KIND_AUTO), not KIND_GPU
# The same for the optional (PyTorch, OpenVINO) models only; part of their repositories' key.
OPTIONAL_GENERATOR_VERSION = 5  # 5: the language and embedding models (the llm extra)


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
        ExampleModel(
            small_models.ACCUMULATOR_NAME,
            small_models.ACCUMULATOR_CONFIG,
            small_models.build_accumulator,
        ),
    ]
    for suffix in small_models.IDENTITY_TYPES:
        models.append(
            ExampleModel(
                small_models.identity_name(suffix),
                small_models.identity_config(suffix),
                functools.partial(small_models.build_identity, suffix),
            )
        )
    return {m.name: m for m in models}


MODELS: dict[str, ExampleModel] = _registry()
EXAMPLE_MODELS: tuple[str, ...] = tuple(MODELS)
LARGE_MODELS: tuple[str, ...] = (resnet.NAME, text_classifier.NAME)
SMALL_MODELS: tuple[str, ...] = tuple(n for n in EXAMPLE_MODELS if n not in LARGE_MODELS)


@dataclass(frozen=True)
class OptionalExampleModel:
    """A model for a backend whose framework is an optional dependency."""

    name: str
    config: str  # config.pbtxt text
    framework: str  # the import that must work ("torch", "openvino")
    extra: str  # the pip extra that installs it
    write: Callable[[pathlib.Path], None]  # writes the version folder's model file(s)
    in_default: bool = True  # served by the default repository when its framework imports


_OPTIONAL: tuple[OptionalExampleModel, ...] = (
    OptionalExampleModel(
        torch_models.SIMPLE_NAME,
        torch_models.SIMPLE_CONFIG,
        "torch",
        "pytorch",
        torch_models.write_simple,
    ),
    OptionalExampleModel(
        torch_models.RESNET_NAME,
        torch_models.RESNET_CONFIG,
        "torch",
        "pytorch",
        torch_models.write_resnet,
    ),
    OptionalExampleModel(
        torch_models.RESNET50_NAME,
        torch_models.RESNET50_CONFIG,
        "torch",
        "pytorch",
        torch_models.write_resnet50,
        in_default=False,
    ),
    OptionalExampleModel(
        openvino_models.SIMPLE_NAME,
        openvino_models.SIMPLE_CONFIG,
        "openvino",
        "openvino",
        openvino_models.write_simple,
    ),
    OptionalExampleModel(
        openvino_models.RESNET_NAME,
        openvino_models.RESNET_CONFIG,
        "openvino",
        "openvino",
        openvino_models.write_resnet,
    ),
    # Triton vLLM model folders on our engine: a chat model and an embedding model (the OpenAI
    # routes serve both), with random weights and a tokenizer trained here.
    OptionalExampleModel(
        "llm_tiny",
        'name: "llm_tiny"\nbackend: "vllm"\n',
        "transformers",
        "llm",
        lambda version: _language_models().write_llm_version(version),
    ),
    OptionalExampleModel(
        "embedder",
        'name: "embedder"\nbackend: "vllm"\n',
        "transformers",
        "llm",
        lambda version: _language_models().write_embedder_version(version),
    ),
)


def _language_models() -> Any:
    """oceanus.examples.language_models, imported only when one of its models is written (it
    imports torch and transformers)."""
    from oceanus.examples import language_models

    return language_models


OPTIONAL: dict[str, OptionalExampleModel] = {m.name: m for m in _OPTIONAL}
# Models for the PyTorch and OpenVINO backends: never in EXAMPLE_MODELS (which stays ONNX only);
# the default repository (example_repository() with no names) adds those whose framework imports.
OPTIONAL_MODELS: tuple[str, ...] = tuple(OPTIONAL)


def framework_available(framework: str) -> bool:
    """Whether `framework` can be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec(framework) is not None
    except (ImportError, ValueError):
        return False


def available_optional_models() -> tuple[str, ...]:
    """The optional models of the default repository whose framework is installed."""
    return tuple(m.name for m in _OPTIONAL if m.in_default and framework_available(m.framework))


def default_models() -> tuple[str, ...]:
    """What the built-in repository serves: every ONNX model, plus the optional models whose
    framework is installed (so one server shows ONNX, PyTorch and OpenVINO side by side)."""
    return EXAMPLE_MODELS + available_optional_models()


def _select(models: Iterable[str] | None) -> list[str]:
    """Validate and de-duplicate *models*, keeping EXAMPLE_MODELS then OPTIONAL_MODELS order
    (None = EXAMPLE_MODELS)."""
    if models is None:
        return list(EXAMPLE_MODELS)
    wanted = set(models)
    known = EXAMPLE_MODELS + OPTIONAL_MODELS
    unknown = sorted(wanted - set(known))
    if unknown:
        raise ValueError(
            f"unknown example model(s) {', '.join(unknown)}; choose from {', '.join(known)}"
        )
    for name in sorted(wanted & set(OPTIONAL_MODELS)):
        model = OPTIONAL[name]
        if not framework_available(model.framework):
            raise ValueError(
                f"example model '{name}' needs {model.framework}, which is not installed: "
                f"pip install oceanus[{model.extra}]"
            )
    return [name for name in known if name in wanted]


def _write_model(root: pathlib.Path, name: str) -> None:
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    if name in OPTIONAL:
        optional = OPTIONAL[name]
        (root / name / "config.pbtxt").write_text(optional.config, encoding="utf-8")
        optional.write(version_dir)
        return
    model = MODELS[name]
    (root / name / "config.pbtxt").write_text(model.config, encoding="utf-8")
    (version_dir / "model.onnx").write_bytes(model.build().SerializeToString())


def _framework_versions(names: Iterable[str]) -> str:
    """Framework versions that the optional models' files depend on (part of the cache key)."""
    frameworks = sorted({OPTIONAL[n].framework for n in names if n in OPTIONAL})
    versions = []
    for framework in frameworks:
        try:
            versions.append(f"{framework}={importlib.metadata.version(framework)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{framework}=?")
    return ";".join(versions)


def write_example_repository(
    path: str | os.PathLike[str], models: Iterable[str] | None = None
) -> pathlib.Path:
    """Write ``<path>/<model>/config.pbtxt`` and ``<path>/<model>/1/model.onnx`` per model
    (``model.pt`` or ``model.xml`` + ``model.bin`` for the optional PyTorch and OpenVINO models,
    which are written only when named)."""
    root = pathlib.Path(path)
    for name in _select(models):
        _write_model(root, name)
    return root


def cache_root() -> pathlib.Path:
    env = os.environ.get("OCEANUS_CACHE_DIR")
    base = pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "oceanus"
    return base / "example-repositories"


def example_repository(models: Iterable[str] | None = None) -> pathlib.Path:
    """Return a cached, complete example repository holding *models* (by default
    `default_models()`: every ONNX model plus the optional ones whose framework is installed).

    The first caller generates it in a temporary sibling directory and renames it into
    place; rename is atomic, so concurrent callers (pytest-xdist workers, two servers) see
    either no directory or a complete one, never a half-written repository.
    """
    names = _select(default_models() if models is None else models)
    key_text = ",".join(names)
    if any(n in OPTIONAL for n in names):
        key_text += f"|optional-v{OPTIONAL_GENERATOR_VERSION}|" + _framework_versions(names)
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    final = cache_root() / f"v{GENERATOR_VERSION}-{key}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    # The first start spends its time here: say what, where, and later how big and how long.
    log.info(
        "generating the %d example models (%s) into %s: once, later starts reuse them "
        "(nothing is downloaded; OCEANUS_CACHE_DIR moves the cache)",
        len(names),
        ", ".join(names),
        final,
    )
    started = time.monotonic()
    try:
        write_example_repository(tmp, names)
        size = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
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
    log.info(
        "generated the example models in %.1f s: %.0f MB in %s",
        time.monotonic() - started,
        size / 1e6,
        final,
    )
    return final
