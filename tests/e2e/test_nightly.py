"""Nightly on the real engine: a simulated history built from two real runs, then a real
`evalpipe nightly` night judged against it, and the dashboard in a real browser.

The simulation (evalpipe.nightly.simulate) makes two real runs of the default config's
nightly task on LIMIT items (as configured, and with the `padding_not_zeroed` layout
fault in `sp`), builds nights from their artifacts -- A/A nights, then the fault
(recorded as vllm_ascend build `fault`), then the fix -- and judges each like
`evalpipe nightly`. Then one more night is a real `evalpipe nightly` run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from browser import artifact_dir, chromium, full_page_screenshot, severe_console_entries
from rich.console import Console

from evalpipe.history.store import open_history
from evalpipe.nightly.simulate import simulate
from evalpipe.reporting import TerminalReporter

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 4.9  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 16
NIGHTS, FAULT, FIX = 36, 30, 33  # 30 A/A nights, 3 with the fault, 3 after the fix


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("nightly")
    console = Console(record=True, width=200)
    summary = simulate(TerminalReporter(console), nights=NIGHTS, fault_night=FAULT, fix_night=FIX, limit=LIMIT, output=out / "sim")
    return {"out": out, "summary": summary, "log": console.export_text()}


def test_the_fault_night_and_only_it_is_flagged_with_its_component(sim):
    summary = sim["summary"]
    statuses = [r.judgement.status for r in summary.nights]
    assert statuses == ["PASS"] * FAULT + ["REGRESSION"] * (FIX - FAULT) + ["PASS"] * (NIGHTS - FIX), sim["log"]
    assert summary.flagged_nights == [f"night-{FAULT:02d}"] and summary.as_expected
    for change in summary.flagged:
        assert change.last_good == f"night-{FAULT - 1:02d}" and not change.open
        assert ("vllm_ascend", "good", "fault") in [(b.component, b.before, b.after) for b in change.bisect]
    first_bad = summary.nights[FAULT].judgement
    assert any(e.variant == "sp" and e.status == "DIVERGENT" for e in first_bad.vs_baseline)
    assert all(e.status == "IDENTICAL" for e in first_bad.vs_baseline if e.variant != "sp")


def test_thirty_a_a_nights_raise_no_alarm(sim):
    nights = sim["summary"].nights[:FAULT]
    assert len(nights) == 30
    # every A/A night passed, and no change of any kind (flagged or pending) was seen before the fault
    assert [r.judgement.status for r in nights] == ["PASS"] * 30
    assert [c for r in nights for c in r.judgement.changes if c.state in ("flagged", "pending")] == []
    assert "A/A nights: 30, nights that were not PASS among them: 0 (false-alarm rate 0.00)" in sim["log"]


def test_a_real_nightly_run_is_judged_against_the_history(sim):
    sim_dir = sim["out"] / "sim"
    url = f"sqlite:///{sim_dir / 'history.sqlite'}"
    dashboard = sim_dir / "dashboard" / "index.html"
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe", "nightly", "--limit", str(LIMIT), "--output", str(sim["out"] / "real"),
         "--history", url, "--dashboard", str(dashboard), "--component", "vllm_ascend=fixed", "--run-id", "real-night"],
        cwd=sim["out"], capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"nightly real-night: PASS (baseline night-{NIGHTS - 1:02d})" in proc.stdout
    run_dir = sim["out"] / "real" / "real-night"
    verdict = json.loads((run_dir / "nightly.json").read_text())
    assert verdict["status"] == "PASS" and verdict["baseline"] == f"night-{NIGHTS - 1:02d}"
    by_variant = {e["variant"]: e["status"] for e in verdict["vs_baseline"]}
    # the last night's sp may be the real sp run or the reference's A/A run (the simulation's draw)
    assert by_variant["legacy"] == "IDENTICAL" and by_variant["sp"] in ("IDENTICAL", "EQUIVALENT"), verdict["vs_baseline"]
    # tonight also teacher-forced the baseline night's reference sequences: the night-over-night
    # comparison includes the teacher-forced positions, on the same forced tokens
    assert all(e["teacher_forced"] and e["teacher"] for e in verdict["vs_baseline"]), verdict["vs_baseline"]
    legacy = next(e for e in verdict["vs_baseline"] if e["variant"] == "legacy")
    assert all(t["identical"] for t in legacy["teacher"])
    for name in ("legacy", "sp"):
        assert (run_dir / name / "teacher_baseline.parquet").is_file()
    assert not (run_dir / "legacy-aa" / "teacher_baseline.parquet").exists()
    suite = ET.parse(run_dir / "nightly-junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and int(suite.get("tests")) >= 3
    assert "PASS" in (run_dir / "nightly.md").read_text()
    hist = open_history(url, sim_dir)
    nights = hist.runs(kind="nightly")
    assert [n.run_id for n in nights][-2:] == [f"night-{NIGHTS - 1:02d}", "real-night"]
    assert hist.variants_of("real-night")[0].components["vllm_ascend"] == "fixed"
    assert "real-night" in dashboard.read_text()


def test_the_dashboard_shows_the_flagged_night_in_chromium(sim, tmp_path):
    from selenium.webdriver.common.by import By

    page = sim["out"] / "sim" / "dashboard" / "index.html"
    with chromium() as driver:
        driver.get(page.as_uri())
        cells = driver.find_elements(By.CSS_SELECTOR, "#timeline .cells .night")
        assert len(cells) >= NIGHTS
        flagged = driver.find_elements(By.CSS_SELECTOR, ".change")
        assert {c.get_attribute("data-run-id") for c in flagged} == {f"night-{FAULT:02d}"}
        assert driver.find_elements(By.CSS_SELECTOR, f'.change-marker[data-run-id="night-{FAULT:02d}"]')
        assert "vllm_ascend" in flagged[0].text and "fault" in flagged[0].text
        assert severe_console_entries(driver) == []
        full_page_screenshot(driver, artifact_dir(tmp_path) / "nightly-simulated.png")
