"""report.html's "Where it starts" section (localize.json) in headless Chromium: the heatmap
and the curve load and show, the sentence is visible, nothing from the labels runs."""

from __future__ import annotations

from browser import artifact_dir, chromium, full_page_screenshot, severe_console_entries
from payloads import SCRIPT
from report_samples import RUN_INFO, as_document, as_run, make_compare

from evalpipe.report.html import render_html
from evalpipe.rundir import artifacts
from tests.report.test_localize import FAULT_SENTENCE, localization


def test_where_it_starts_in_chromium(tmp_path):
    from selenium.webdriver.common.by import By

    page = tmp_path / "report.html"
    doc = localization(label="gsm8k doc 3 " + SCRIPT)
    artifacts.write_text(page, render_html(as_document(make_compare()), as_run(RUN_INFO), localizations=[doc]))
    with chromium() as driver:
        driver.get(page.as_uri())
        assert driver.execute_script("return window.__pwned") is None
        assert severe_console_entries(driver) == []
        for name in ("localize-heatmap", "localize-curve"):
            img = driver.find_element(By.ID, name)
            assert img.is_displayed()
            assert driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 0
            assert img.get_attribute("alt")
        section = driver.find_element(By.ID, "where-it-starts")
        sentence = section.find_element(By.CLASS_NAME, "localize-sentence")
        assert sentence.is_displayed() and FAULT_SENTENCE in sentence.text
        assert SCRIPT in section.text  # the label reads as text
        driver.execute_script("arguments[0].scrollIntoView()", section)
        shot = full_page_screenshot(driver, artifact_dir(tmp_path) / "report-localize.png")
        assert shot.stat().st_size > 10_000
