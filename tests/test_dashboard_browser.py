"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver) via Selenium.

What only a browser can show: the page loads from file:// without console errors,
the injected payloads do not run, and the text a person reads holds them literally.
The screenshot is kept as a test artifact (reports/test-artifacts/dashboard.png).

No network: the driver and the browser are the system's, given by path, so
Selenium Manager never runs (it would try to download a driver).
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest

from dashboard_samples import IMG, SCRIPT, run_id, sample_history
from evalpipe.report.dashboard import write_dashboard

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "reports" / "test-artifacts"
N_NIGHTS, CHANGE_AT = 12, 8
INSTALL_HINT = "install them with: sudo apt-get install -y chromium chromium-driver"


def _browser_paths() -> tuple[str, str]:
    driver = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = [name for name, path in (("chromedriver", driver), ("chromium", browser)) if not path]
    if missing:
        # a failure, not a skip: the suite counts skips as failures anyway, and the message says what to do
        pytest.fail(f"{' and '.join(missing)} not found on PATH; the browser test needs Debian's headless "
                    f"Chromium: {INSTALL_HINT}", pytrace=False)
    return browser, driver


@pytest.fixture(scope="module")
def driver():
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


def _history() -> dict:
    data = sample_history(n_nights=N_NIGHTS, change_at=CHANGE_AT)
    # the payloads sit in a flipped item's prompt and a component version (and a regression's
    # reason, which is also a tooltip attribute of its timeline cell)
    assert SCRIPT in data["changes"][0]["flipped"][3]["prompt"] and IMG in data["changes"][0]["flipped"][3]["prompt"]
    assert SCRIPT in data["changes"][0]["bisect"][0]["after"]
    return data


def _artifact_dir(tmp_path: Path) -> Path:
    try:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        if os.access(ARTIFACTS, os.W_OK):
            return ARTIFACTS
    except OSError:
        pass
    return tmp_path


def test_dashboard_in_chromium(driver, tmp_path):
    from selenium.webdriver.common.by import By

    page = write_dashboard(_history(), tmp_path / "dashboard.html")
    driver.get(page.as_uri())

    assert driver.title == "evalpipe nightly — configs/default.yaml"
    assert "REGRESSION" in driver.find_element(By.ID, "latest").text

    cells = driver.find_elements(By.CSS_SELECTOR, "#timeline .cells .night")
    assert [c.get_attribute("data-run-id") for c in cells] == [run_id(i) for i in range(N_NIGHTS)]
    assert cells[0].size["width"] > 0 and cells[0].size["height"] > 0

    flagged = run_id(CHANGE_AT)
    changes = driver.find_elements(By.CSS_SELECTOR, ".change")
    assert [c.get_attribute("data-run-id") for c in changes] == [flagged]
    assert driver.find_elements(By.CSS_SELECTOR, f'.change[data-run-id="{flagged}"]')[0].is_displayed()
    markers = driver.find_elements(By.CSS_SELECTOR, f'figure.chart.score .change-marker[data-run-id="{flagged}"]')
    assert len(markers) == 1 and markers[0].is_displayed()
    assert len(driver.find_elements(By.CSS_SELECTOR, "figure.chart.score circle.dot")) == N_NIGHTS

    # the payloads did not run and read as text
    assert driver.execute_script("return window.__pwned") is None
    body = driver.find_element(By.TAG_NAME, "body").text
    assert SCRIPT in body and IMG in body and f"0.32.1+{SCRIPT}" in body
    assert driver.find_elements(By.CSS_SELECTOR, "body script, body img") == []

    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == [], f"console errors: {severe}"

    # the whole page, not just the window: DevTools' capture beyond the viewport
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
    png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})
    shot = _artifact_dir(tmp_path) / "dashboard.png"
    shot.write_bytes(base64.b64decode(png["data"]))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
