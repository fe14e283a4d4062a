"""Fixtures of the in-process core tests (tests/core/fakes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.fakes import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A repository of fake-backend models, a manual clock, and a core to run them on."""
    return World(tmp_path)
