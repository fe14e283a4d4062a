"""Headless Chromium from the distribution (Debian's `chromium` and `chromium-driver`, which
scripts/test.sh installs), driven by Selenium. Nothing is downloaded: the browser and its driver
are named by path, so Selenium Manager never looks for others."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# Without the flags that stop background networking, Chromium waits on a closed network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def missing() -> str:
    """Why the browser tests cannot run here ("" when they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e .[test])"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return ""


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless Chromium with a fresh profile, closed (profile removed) afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="oceanus-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def require() -> None:
    """Skip where the browser is missing; in CI (CI=true), where scripts/test.sh installs it,
    fail instead."""
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
