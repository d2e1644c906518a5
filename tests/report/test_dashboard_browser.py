"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver) via Selenium.

What only a browser can show: the page loads from file:// without console errors,
the injected payloads do not run, and the text a person reads holds them literally.
The screenshot is kept as a test artifact (reports/test-artifacts/dashboard.png).
"""

from __future__ import annotations

import pytest
from browser import artifact_dir, chromium, full_page_screenshot, severe_console_entries
from dashboard_samples import IMG, SCRIPT, render, run_id, sample_history

from evalpipe.rundir.artifacts import write_text

N_NIGHTS, CHANGE_AT = 12, 8


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


def _history() -> dict:
    data = sample_history(n_nights=N_NIGHTS, change_at=CHANGE_AT)
    # the payloads sit in a flipped item's prompt and a component version (and a regression's
    # reason, which is also a tooltip attribute of its timeline cell)
    assert SCRIPT in data["changes"][0]["flipped"][3]["prompt"] and IMG in data["changes"][0]["flipped"][3]["prompt"]
    assert SCRIPT in data["changes"][0]["bisect"][0]["after"]
    return data


def test_dashboard_in_chromium(driver, tmp_path):
    from selenium.webdriver.common.by import By

    page = tmp_path / "dashboard.html"
    write_text(page, render(_history()))
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

    severe = severe_console_entries(driver)
    assert severe == [], f"console errors: {severe}"

    shot = full_page_screenshot(driver, artifact_dir(tmp_path) / "dashboard.png")
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
