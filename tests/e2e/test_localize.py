"""`evalpipe localize` end to end on the real engine, served and offline in one run: the
reference and its A/A configuration behind vLLM's real OpenAI server (CPU build), the
variant offline, carrying a zoo fault (`heads_permuted`: the all_to_all hands each
virtual rank another rank's heads). The run comes out DIVERGENT; localize, started from
the command line, names the fault's layer and module from the captures of each server's
engine core and of the offline worker, and report.html shows the heatmap in headless
Chromium. tests/e2e/test_calibrate.py localizes every zoo entry of its slice offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import in_process
import pytest
import yaml
from browser import chromium

from evalpipe.install import default_config

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 3.4  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 2
SP_PATH = "evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention"


@pytest.fixture(scope="module")
def localized(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("localize")
    cfg = {
        "extends": str(default_config().with_name("serve.yaml")),
        "output": str(tmp / "runs"),
        # the run's A/A reuses the reference's server (one start less); localize starts one of
        # its own for it all the same (a shared server would mix its captures with the reference's)
        "noise_floor": {"reuse_server": True},
        "engine": {"max_num_seqs": 2},
        "launch": {"concurrency": 1},
        "variants": {
            "legacy": yaml.safe_load(default_config().read_text())["variants"]["legacy"],
            "permuted": {"env": {"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": "heads_permuted"},
                         "expect": {"called": [SP_PATH]}, "launch": {"mode": "offline"}},
        },
    }
    path = tmp / "served.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", str(LIMIT),
                          "--run-id", "loc"], cwd=tmp, capture_output=True, text=True, timeout=1800)
    run_dir = tmp / "runs" / "loc"
    # with decode steps: each configuration's engine also runs the first generated tokens one
    # forward pass each, where single-token layout bugs live
    loc = in_process.evalpipe("localize", str(run_dir), "--samples", "2", "--decode-steps", "2", cwd=tmp)
    return {"run": run, "localize": loc, "dir": run_dir}


def test_the_fault_is_divergent_and_localize_names_its_layer_and_module(localized):
    run, loc = localized["run"], localized["localize"]
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert loc.returncode == 0, loc.stdout[-3000:] + loc.stderr[-3000:]
    assert "permuted: first difference above the A/A floor: layer 0, attention output before the output projection" in \
        " ".join(loc.stdout.split()), loc.stdout
    doc = json.loads((localized["dir"] / "localize.json").read_text())["localizations"][0]
    assert doc["variant"] == "permuted" and doc["reference"] == "legacy" and doc["aa"] == "legacy-aa"
    assert doc["modes"] == {"legacy": "serve", "legacy-aa": "serve", "permuted": "offline"}
    assert len(doc["sequences"]) == 2
    assert (doc["first"]["layer"], doc["first"]["module"]) == (0, "attn.heads")
    # nothing before it moved, not even in the last bits: the fault is the first difference
    before = [m for m in doc["modules"] if m["layer"] == 0 and m["module"] == "attn.in"]
    assert before and before[0]["rel_l2"] == 0 and before[0]["rows"] > 0
    assert doc["first"]["rel_l2"] > 0.1 and doc["first"]["floor"] >= 1e-5
    assert doc["not_reassembled"] == []
    # the decode steps were captured and compared as rows of their own, in every sequence
    for sequence in doc["sequences"]:
        reasons = [w for why in sequence["why"].values() for w in why]
        assert "decode step 2 (one token per forward pass)" in reasons, sequence


def test_each_configuration_ran_its_own_engine_which_captured(localized):
    doc = json.loads((localized["dir"] / "localize.json").read_text())["localizations"][0]
    assert set(doc["seconds"]) == {"legacy", "legacy-aa", "permuted", "analysis"}
    for name in ("legacy", "legacy-aa", "permuted"):
        where = localized["dir"] / "localize" / name
        captures = list((where / "captures").glob("*.jsonl"))
        assert len(captures) == 1, captures  # one engine process captured: the server's engine core, the offline worker
        assert (where / "engine.log").is_file() and doc["capture_bytes"][name] > 0
    # the A/A ran the same code on the same single-sequence batches: bitwise the reference
    assert doc["aa_identical"] is True


def test_report_html_shows_the_heatmap_in_a_browser(localized):
    html = localized["dir"] / "report.html"
    text = html.read_text()
    assert "localize-heatmap" in text and "layer 0, attention output before the output projection" in text
    with chromium() as driver:
        driver.get(html.as_uri())
        image = driver.find_element("id", "localize-heatmap")
        assert driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image) > 100
        assert image.is_displayed()
        assert "first difference above the A/A floor" in driver.find_element("tag name", "body").text


def test_markdown_report_has_the_section(localized):
    text = (localized["dir"] / "report.md").read_text()
    assert "Where it starts" in text and "layer 0" in text


def test_localize_refuses_the_reference_as_variant_in_one_sentence(localized):
    out = in_process.evalpipe("localize", str(localized["dir"]), "--variant", "legacy", cwd=Path(localized["dir"]))
    assert out.returncode == 2
    assert "--variant legacy: not a variant compared in" in " ".join(out.stderr.split()) + " ".join(out.stdout.split())
