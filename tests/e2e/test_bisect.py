"""`evalpipe bisect` on the real engine: sixteen commits of a small plugin of the built-in model
(evalpipe.lab.bisect_repo), one of each kind a bisect must tell apart.

- the harmful commit (layer 1's W_o times 1 + 1e-3: no score moves) is named, in at most
  ceil(log2 15) + 2 steps, each of at most two runs (a DIFFERENT build is run twice);
- the benign commit (another summation order) is never blamed: every build from it on up to
  the harmful one that was tested is SAME or skipped;
- the broken commit (its plugin imports an extension never built) is skipped with its reason;
- the nondeterministic commit is not blamed on one run: its two runs differ from each other,
  so it is skipped;
- the first DIFFERENT build is localized against its parent at layer 1's attention output;
- run again, the bisect continues from its journal and runs nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from math import ceil, log2

import pytest
import yaml

from evalpipe.install import shipped_dir
from evalpipe.lab import bisect_repo as R

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 6  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)
LIMIT = 4


@pytest.fixture(scope="module")
def bisected(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bisect")
    shas = R.build_repository(tmp / "repo")
    cfg = {"extends": str(shipped_dir("configs") / "default.yaml"), "output": str(tmp / "runs"),
           "bisect": {"repo": str(tmp / "repo"), "variant": "sp"}}
    (tmp / "bisect.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "evalpipe", "bisect", "-c", str(tmp / "bisect.yaml"), "--good", shas[0], "--bad", shas[-1],
           "--limit", str(LIMIT)]
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=1800)
    journals = list((tmp / "bisect").glob("*/bisect.json"))
    assert len(journals) == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {"proc": proc, "cmd": cmd, "tmp": tmp, "shas": shas, "root": journals[0].parent,
            "journal": json.loads(journals[0].read_text())}


def steps_by_commit(run: dict) -> dict[int, dict]:
    index = {sha: i for i, sha in enumerate(run["shas"])}
    return {index[s["commit"]]: s for s in run["journal"]["steps"]}


def test_the_harmful_commit_is_named_in_log2_steps(bisected):
    assert bisected["proc"].returncode == 0, bisected["proc"].stdout[-3000:] + bisected["proc"].stderr[-3000:]
    answer = bisected["journal"]["answer"]
    assert answer["kind"] == "found" and answer["first_different"] == bisected["shas"][R.HARMFUL]
    steps = bisected["journal"]["steps"]
    assert len(steps) <= ceil(log2(R.COMMITS - 1)) + 2, [s["commit"][:12] for s in steps]
    assert all(len(s["attempts"]) <= 2 for s in steps)
    harmful = steps_by_commit(bisected)[R.HARMFUL]
    assert harmful["verdict"] == "DIFFERENT" and "confirmed by a second run" in harmful["reason"]
    evidence = harmful["attempts"][0]["evidence"]
    assert evidence["flipped"] == 0, "no score moved: the tokens' distributions told"
    assert evidence["failed_gates"] and evidence["kl_p99"] is not None


def test_the_benign_commit_is_never_blamed_and_the_broken_and_flaky_ones_are_skipped_with_their_reasons(bisected):
    by = steps_by_commit(bisected)
    assert all(s["verdict"] in ("SAME", "SKIP") for i, s in by.items() if R.BENIGN <= i < R.HARMFUL), by
    assert by[R.BROKEN]["verdict"] == "SKIP" and "demo_layout_plugin_fused_ext" in by[R.BROKEN]["reason"]
    if R.FLAKY in by:  # the search looks there when the bisect's middles fall on it (they do for these 16)
        assert by[R.FLAKY]["verdict"] == "SKIP" and "does not repeat itself" in by[R.FLAKY]["reason"]


def test_the_first_different_build_is_localized_and_the_reports_say_it(bisected):
    answer = bisected["journal"]["answer"]
    assert answer["localize_dir"] and "layer 1" in (answer["localized"] or ""), answer
    md = (bisected["root"] / "bisect.md").read_text()
    assert "fold the output scale into W\\_o" in md or "fold the output scale into W_o" in md
    assert "`demo\\_layout\\_plugin/patches.py`" in md, "the files the commit changed"
    assert (bisected["root"] / "bisect.html").is_file()


def test_run_again_it_continues_from_its_journal_and_runs_nothing(bisected):
    before = sorted(p.name for p in (bisected["root"] / "runs").iterdir())
    again = subprocess.run(bisected["cmd"], cwd=bisected["tmp"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "continuing" in again.stdout and "starting engine" not in again.stdout
    assert sorted(p.name for p in (bisected["root"] / "runs").iterdir()) == before
