"""A model's own Python environment: Triton's `EXECUTION_ENV_PATH` model parameter.

The parameter names a conda-pack or venv-pack archive (`.tar.gz`, `.tgz`, `.tar`) or an
environment folder; `$$TRITON_MODEL_DIRECTORY` in it stands for the model's folder. An archive is
unpacked once into a cache (`OCEANUS_PYTHON_ENV_CACHE`, default `~/.cache/oceanus/python-envs`)
under a name keyed by its path, size and modification time, so later loads, reloads, restarted
stubs and restarted servers reuse it. The stub then runs on that environment's interpreter with
the environment activated as Triton's launcher does (its `bin` first on PATH, its `lib` on
LD_LIBRARY_PATH). Our stub is Python, so the environment needs what it imports: Python >= 3.10
and numpy (Triton's stub needs the same numpy, and a Python matching the stub's build). A short
probe checks that once per environment, so a missing numpy is a load error naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tarfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python.stub_launcher import stub_env
from oceanus.core.errors import InferenceServerError, invalid_arg

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
CACHE_VARIABLE = "OCEANUS_PYTHON_ENV_CACHE"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
# Written last into an unpacked environment: its presence means the unpacking finished.
_DONE_MARKER = ".oceanus-unpacked"
_PROBE_TIMEOUT_S = 120.0
# What the stub imports at start (pb_stub's own imports pull in numpy and the pb/ package).
_PROBE = "import oceanus.backends.python.pb_stub"

_lock = threading.Lock()  # one unpacking or probe at a time in this process
_probed: set[tuple[str, int]] = set()  # interpreters that passed the probe (path, mtime)


@dataclass(frozen=True)
class PythonEnv:
    """The interpreter a stub runs on and the variables that activate its environment."""

    python: str
    prefix: str
    stub_root: str  # a folder holding only `oceanus`, for the stub's PYTHONPATH
    variables: dict[str, str] = field(default_factory=dict)

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        """The stub's environment variables with this environment activated."""
        env = dict(env)
        env.pop("PYTHONHOME", None)
        bin_dir = os.path.join(self.prefix, "bin")
        env["PATH"] = bin_dir + (os.pathsep + env["PATH"] if env.get("PATH") else "")
        lib = os.path.join(self.prefix, "lib")
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = lib + (os.pathsep + old if old else "")
        env.update(self.variables)
        return env


def configured_path(config: mc.ModelConfig, model_dir: Path) -> str | None:
    """The parameter's value with `$$TRITON_MODEL_DIRECTORY` replaced, or None when unset."""
    for key, value in config.parameters.items():
        if key == PARAMETER and value.string_value:
            return str(value.string_value).replace(MODEL_DIRECTORY, str(model_dir))
    return None


def resolve(config: mc.ModelConfig, model_dir: Path) -> PythonEnv | None:
    """The model's environment, unpacked and checked; None when the model has none."""
    path = configured_path(config, model_dir)
    if path is None:
        return None
    with _lock:
        try:
            prefix = _prefix(config.name, path)
            stub_root = _stub_root()
        except OSError as exc:  # an unwritable cache, a full disk
            raise _error(
                config.name, path, f"cannot be prepared in the cache {cache_root()}: {exc}"
            ) from None
        python = _interpreter(config.name, path, prefix)
        env = PythonEnv(python, str(prefix), stub_root, _activation(prefix))
        _probe(config.name, path, env)
    return env


def cache_root() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "oceanus" / "python-envs"


def _error(model: str, path: str, what: str) -> InferenceServerError:
    return invalid_arg(f"model '{model}': {PARAMETER} '{path}' {what}")


def _prefix(model: str, path: str) -> Path:
    """The environment's folder: the folder named, or the archive's unpacked copy."""
    source = Path(path)
    if source.is_dir():
        return source.resolve()
    if not source.exists():
        raise _error(model, path, "does not exist")
    if not path.endswith(ARCHIVE_SUFFIXES):
        raise _error(
            model, path, "is neither a folder nor an archive (.tar.gz, .tgz or .tar) of one"
        )
    stat = source.stat()
    # Path, size and mtime, not the content: hashing a GB-sized conda-pack at every load
    # would cost seconds; a rewritten archive gets a new mtime and so a new copy.
    key = hashlib.sha256(f"{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    stem = source.name.removesuffix(".tar.gz").removesuffix(".tgz").removesuffix(".tar")
    target = cache_root() / f"{stem}-{key.hexdigest()[:16]}"
    if (target / _DONE_MARKER).exists():
        return target
    _unpack(model, path, source, target)
    return target


def _unpack(model: str, path: str, source: Path, target: Path) -> None:
    """Unpack into a scratch folder beside the target and rename it into place, so a crash or
    another server unpacking the same archive never leaves a half environment under its name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            with tarfile.open(source, "r:*") as archive:
                # "tar", not "data": venv-pack archives hold absolute symlinks to the base
                # interpreter; names still cannot leave the folder.
                archive.extractall(scratch, filter="tar")
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise _error(model, path, f"is not a readable archive: {exc}") from None
        unpack_script = scratch / "bin" / "conda-unpack"
        if unpack_script.exists():  # conda-pack: rewrite the prefixes baked into the files
            python = _find_python(scratch)
            if python is None:
                raise _error(model, path, "holds no bin/python3 or bin/python")
            done = subprocess.run(
                [python, str(unpack_script)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise _error(model, path, f"failed conda-unpack: {_last_line(done.stderr)}")
        (scratch / _DONE_MARKER).write_text(str(source) + "\n")
        try:
            os.rename(scratch, target)
        except OSError:
            if not (target / _DONE_MARKER).exists():
                raise
            # Another process unpacked it first: use theirs.
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def _find_python(prefix: Path) -> str | None:
    for name in ("python3", "python"):
        candidate = prefix / "bin" / name
        if candidate.exists():
            return str(candidate)
    return None


def _interpreter(model: str, path: str, prefix: Path) -> str:
    python = _find_python(prefix)
    if python is None:
        raise _error(model, path, "holds no bin/python3 or bin/python")
    return python


def _stub_root() -> str:
    """A folder whose one entry links to this package: on the stub's PYTHONPATH it makes
    Oceanus importable without the server's site-packages (where an installed Oceanus lives),
    whose packages would shadow the environment's own."""
    package = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:16]
    root = cache_root() / f".stub-{digest}"
    link = root / "oceanus"
    if not link.exists():
        root.mkdir(parents=True, exist_ok=True)
        scratch = root / f".oceanus-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        scratch.symlink_to(package, target_is_directory=True)
        os.replace(scratch, link)
    return str(root)


def _activation(prefix: Path) -> dict[str, str]:
    if (prefix / "conda-meta").is_dir():
        return {"CONDA_PREFIX": str(prefix)}
    return {"VIRTUAL_ENV": str(prefix)}


def _probe(model: str, path: str, env: PythonEnv) -> None:
    """Start the environment's interpreter once and import what the stub needs."""
    with contextlib.suppress(OSError):
        key = (env.python, os.stat(env.python).st_mtime_ns)
        if key in _probed:
            return
    try:
        done = subprocess.run(
            [env.python, "-c", _PROBE],
            env=env.apply(stub_env()),
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _error(model, path, f"has an interpreter that does not start: {exc}") from None
    if done.returncode != 0:
        raise _error(
            model,
            path,
            "cannot run the Python backend's stub (it needs Python >= 3.10 and numpy): "
            + _last_line(done.stderr),
        )
    with contextlib.suppress(OSError):
        _probed.add((env.python, os.stat(env.python).st_mtime_ns))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"
