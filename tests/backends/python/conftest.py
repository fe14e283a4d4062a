"""Fixtures for the Python backend tests: the model.py repository under ./models, copied."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "models"


def copy_models(target: Path, names: Sequence[str] | None = None) -> Path:
    """A repository holding copies of the test models (all, or those named)."""
    target.mkdir(parents=True, exist_ok=True)
    for folder in sorted(MODELS.iterdir()):
        if folder.is_dir() and (names is None or folder.name in names):
            shutil.copytree(
                folder, target / folder.name, ignore=shutil.ignore_patterns("__pycache__")
            )
    return target


@pytest.fixture(scope="module")
def python_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("python-models"))


@pytest.fixture(scope="module")
def python_server(launch_module: Callable[..., object], python_repository: Path) -> object:
    """One server with every test model, shared by the tests of a module."""
    return launch_module([python_repository])
