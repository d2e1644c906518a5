"""Any lm-eval task runs on the same engine, not only generation: lm-eval's own
`arc_easy` (multiple choice -> loglikelihood) and `wikitext` (perplexity ->
loglikelihood_rolling), pointed at small local files through `data_files`."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import yaml

from evalpipe.install import default_config
from evalpipe.rundir import artifacts

pytestmark = pytest.mark.slow

ARC = [
    {"id": f"q{i}", "question": q, "choices": {"text": choices, "label": ["A", "B", "C"]}, "answerKey": key}
    for i, (q, choices, key) in enumerate(
        [
            ("Tom has 3 apples and buys 2 more. How many apples does he have?", ["5", "6", "1"], "A"),
            ("There are 10 birds and 4 fly away. How many are left?", ["14", "6", "4"], "B"),
            ("Sam reads 2 books a day for 3 days. How many books?", ["5", "1", "6"], "C"),
            ("A box holds 12 pens. Half are red. How many are red?", ["6", "24", "10"], "A"),
        ]
    )
]
PAGES = [
    {"page": "Tom has 12 apples. He buys 7 more. Now he has 19 apples.\n" * 3},
    {"page": "There are 4 rows with 10 chairs in each. That is 40 chairs in all.\n" * 2},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("other")
    files = {}
    for name, rows in (("arc", ARC), ("wiki", PAGES)):
        for split in ("train", "validation", "test"):
            path = tmp / f"{name}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            files.setdefault(name, {})[split] = str(path)
    cfg = yaml.safe_load(default_config().read_text())
    cfg["tasks"] = {
        "other": [
            {"task": "arc_easy", "data_files": files["arc"]},
            {"task": "wikitext", "data_files": files["wiki"]},
        ]
    }
    cfg["output"] = str(tmp / "runs")
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe", "run", "other", "-c", str(path), "--variants", cfg["reference"], "--no-noise-floor", "--run-id", "r"],
        cwd=tmp, capture_output=True, text=True, timeout=1800,
    )
    return {"proc": proc, "dir": tmp / "runs" / "r", "ref": cfg["reference"]}


def test_likelihood_tasks_run_and_score(run):
    # the reference alone: it ran and scored, and compared nothing (exit 4, never a pass)
    assert run["proc"].returncode == 4, run["proc"].stdout[-2000:] + run["proc"].stderr[-2000:]
    assert "nothing was compared" in run["proc"].stdout
    vdir = artifacts.VariantDir(run["dir"] / run["ref"])
    results = artifacts.read_json(vdir.results)["results"]
    assert 0.0 <= results["arc_easy"]["acc,none"] <= 1.0
    ppl = results["wikitext"]["word_perplexity,none"]
    assert math.isfinite(ppl) and ppl > 1.0
    samples = artifacts.read_table(vdir.samples).to_pylist()
    arc = [s for s in samples if s["task"] == "arc_easy"]
    assert len(arc) == len(ARC)
    # one (logprob, is_greedy) per choice, and the logprobs are real numbers below 0
    choices = json.loads(arc[0]["response"])
    assert len(choices) == 3 and all(lp < 0 for lp, _ in choices)
