"""The model repository on disk: scanning folders, reading configs, choosing versions, loading.

Everything here is blocking file and framework work; the server core runs it on loader threads,
never on the event loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.backend import (
    Backend,
    BackendInstance,
    InstanceSpec,
    LoadContext,
    ModelFiles,
    ServerHandle,
)
from oceanus.core.backend_registry import BackendRegistry
from oceanus.core.ensemble import steps as ensemble
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.repository import model_config
from oceanus.core.types import is_number

log = logging.getLogger("oceanus.core.repository")

CONFIG_FILENAME = "config.pbtxt"


# --model-namespacing: a model name found in several repositories is known inside the core as
# "<repository>::<name>" (each one), and shown by its plain name (docs/model-namespacing.md).
NAMESPACE_SEPARATOR = "::"


def scan(repositories: Iterable[Path], namespacing: bool = False) -> dict[str, Path]:
    """Model key -> model folder for every folder in the repositories (hidden ones skipped).

    The key is the folder's name; with `namespacing`, a name in several repositories gets one
    "<repository>::<name>" key per repository (without, that is an error)."""
    found: dict[str, list[Path]] = {}
    for repository in repositories:
        for entry in sorted(repository.iterdir()):
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            if entry.name in found and not namespacing:
                raise invalid_arg(
                    f"model '{entry.name}' appears in multiple repositories: "
                    f"{found[entry.name][0].parent} and {repository}"
                )
            found.setdefault(entry.name, []).append(entry)
    keys: dict[str, Path] = {}
    for name, folders in found.items():
        if len(folders) == 1:
            keys[name] = folders[0]
        else:
            keys.update(
                {f"{folder.parent}{NAMESPACE_SEPARATOR}{name}": folder for folder in folders}
            )
    return keys


def display_name(key: str) -> str:
    """A model's name as the API shows it (its key without the namespace)."""
    return key.rpartition(NAMESPACE_SEPARATOR)[2]


def key_near(name: str, folder: Path, keys: Iterable[str]) -> str:
    """The key of model `name` as the model in `folder` sees it: the one in its own repository
    when the name is namespaced (ensembles resolve their steps within their repository)."""
    own = f"{folder.parent}{NAMESPACE_SEPARATOR}{name}"
    return own if own in set(keys) else name


def version_folders(model_dir: Path) -> dict[int, Path]:
    """Numeric subfolders; anything else is ignored, as in Triton."""
    versions: dict[int, Path] = {}
    for entry in model_dir.iterdir():
        if entry.is_dir() and is_number(entry.name) and not entry.name.startswith("0"):
            versions[int(entry.name)] = entry
    return versions


def select_versions(policy: mc.ModelVersionPolicy, available: Iterable[int]) -> list[int]:
    ordered = sorted(available)
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return ordered
    if choice == "specific":
        return [v for v in ordered if v in set(policy.specific.versions)]
    count = policy.latest.num_versions or 1
    return ordered[-count:]


def read_config(model_dir: Path, autocomplete: bool, backends: BackendRegistry) -> mc.ModelConfig:
    """The model's config as written, or a minimal one when auto-complete may fill it."""
    path = model_dir / CONFIG_FILENAME
    if path.exists():
        config = model_config.read_config_file(path)
    elif autocomplete:
        config = mc.ModelConfig()
    else:
        raise invalid_arg(
            f"failed to load model '{model_dir.name}': config.pbtxt is required when "
            "auto-complete is disabled (--disable-auto-complete-config)"
        )
    if not config.name:
        config.name = model_dir.name
    if not config.backend and not config.platform and autocomplete:
        # Triton's auto-complete recognizes a model by its file name.
        guess = backends.guess(version_folders(model_dir).values())
        if guess is not None:
            config.backend, config.platform = guess
    return config


@dataclass
class LoadedVersion:
    version: int
    path: Path
    instances: list[tuple[InstanceSpec, BackendInstance]] = field(default_factory=list)
    error: InferenceServerError | None = None
    load_seconds: float = 0.0


@dataclass
class LoadedModel:
    name: str
    config: mc.ModelConfig
    versions: list[LoadedVersion]


def prepare_config(
    model_dir: Path,
    autocomplete: bool,
    gpu_count: int,
    backends: BackendRegistry,
    override: mc.ModelConfig | None = None,
) -> tuple[mc.ModelConfig, Backend | None, dict[int, Path]]:
    """Read (or take the override of), complete, validate and normalize a model's config
    (the backend is None for an ensemble)."""
    if override is not None:
        config = mc.ModelConfig()
        config.CopyFrom(override)
        if not config.name:
            config.name = model_dir.name
    else:
        config = read_config(model_dir, autocomplete, backends)
    model_config.validate_name(config, model_dir.name)
    if config.platform and not config.backend:
        config.backend = backends.backend_for_platform(config.platform) or ""
    model_config.resolve_backend(config)
    # An ensemble has no backend and no model file: the core runs its steps
    # (core/ensemble/steps.py).
    backend: Backend | None = None
    if ensemble.is_ensemble(config) or config.HasField("ensemble_scheduling"):
        ensemble.validate_config(config)
    else:
        backend = backends.get(config.backend or config.platform)
    available = version_folders(model_dir)
    if config.HasField("version_policy"):
        policy = config.version_policy
    else:
        policy = mc.ModelVersionPolicy()
        policy.latest.num_versions = 1
    chosen = select_versions(policy, available)
    if chosen and backend is not None:
        newest = chosen[-1]
        backend.complete_config(config, backend.model_path(config, available[newest]), autocomplete)
    model_config.validate(config, model_dir.name)
    model_config.normalize(config, gpu_count=gpu_count)
    return config, backend, {v: available[v] for v in chosen}


def instance_specs(config: mc.ModelConfig, gpu_count: int, cpu_count: int) -> list[InstanceSpec]:
    """One spec per instance, named as Triton names them, GPU kinds falling back to CPU."""
    total = sum(group.count for group in config.instance_group) or 1
    # Instances of one model share the cores instead of each taking all of them.
    threads = max(1, cpu_count // total)
    specs: list[InstanceSpec] = []
    warned = False
    used: dict[str, int] = {}
    for group in config.instance_group:
        gpus = list(group.gpus) or [0]
        for index in range(group.count):
            number = used.get(group.name, 0)
            used[group.name] = number + 1
            kind = "CPU"
            device = 0
            if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                if gpu_count > 0:
                    kind, device = "GPU", gpus[index % len(gpus)]
                elif not warned:
                    log.warning(
                        "model '%s': instance group '%s' asks for KIND_GPU but no GPU is "
                        "available; running it on the CPU",
                        config.name,
                        group.name,
                    )
                    warned = True
            specs.append(InstanceSpec(f"{group.name}_{number}", kind, device, threads))
    return specs


def load_version(
    config: mc.ModelConfig,
    backend: Backend,
    version: int,
    path: Path,
    gpu_count: int,
    server: ServerHandle | None = None,
) -> LoadedVersion:
    """Create every instance of one version (blocking); an error is kept, not raised."""
    started = time.monotonic()
    loaded = LoadedVersion(version=version, path=path)
    try:
        files = ModelFiles(path.parent, path, backend.model_path(config, path))
        for spec in instance_specs(config, gpu_count, os.cpu_count() or 1):
            context = LoadContext(config, files, spec, server)
            loaded.instances.append((spec, backend.load(context)))
    except InferenceServerError as exc:
        loaded.error = exc
    except Exception as exc:
        loaded.error = invalid_arg(f"failed to load '{config.name}' version {version}: {exc}")
    if loaded.error is not None:
        for _, instance in loaded.instances:
            instance.close()
        loaded.instances.clear()
    loaded.load_seconds = time.monotonic() - started
    return loaded
