"""Headless Chromium for the tests (Debian's chromium + chromium-driver) via Selenium.

No network: the driver and the browser are the system's, given by path, so Selenium
Manager never runs (it would try to download a driver)."""

from __future__ import annotations

import base64
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from checkout import ROOT

ARTIFACTS = ROOT / "reports" / "test-artifacts"
INSTALL_HINT = "install them with: sudo apt-get install -y chromium chromium-driver (or bash scripts/setup.sh --tests)"


def _browser_paths() -> tuple[str, str]:
    driver = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = [name for name, path in (("chromedriver", driver), ("chromium", browser)) if not path]
    if missing:
        # a failure, not a skip: the suite counts skips as failures anyway, and the message says what to do
        pytest.fail(f"{' and '.join(missing)} not found on PATH; the browser test needs Debian's headless "
                    f"Chromium: {INSTALL_HINT}", pytrace=False)
    return browser, driver


@contextmanager
def chromium() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, chromedriver = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        yield d
    finally:
        d.quit()


def severe_console_entries(driver) -> list:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def artifact_dir(tmp_path: Path) -> Path:
    """reports/test-artifacts (kept after the run), else the test's temporary directory."""
    try:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        if os.access(ARTIFACTS, os.W_OK):
            return ARTIFACTS
    except OSError:
        pass
    return tmp_path


def full_page_screenshot(driver, path: Path) -> Path:
    """The whole page, not just the window: DevTools' capture beyond the viewport."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})
    path.write_bytes(base64.b64decode(png["data"]))
    return path
