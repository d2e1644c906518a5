"""`evalpipe run longctx` end to end on the real engine with the reference layout model,
at small lengths around a 1024-token block: the probes' prompts reach the engine with
exactly their target token counts (edge cases included), legacy vs sp stays
equivalent at every length, and a padding fault (which bites only when a batch is not a
multiple of the rank count) is caught."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.compute as pc
import pytest
import yaml

from evalpipe.data.longctx import LongCtxSpec, target_lengths
from evalpipe.install import default_config
from evalpipe.rundir import artifacts

pytestmark = pytest.mark.slow

SPEC = {"lengths": [1024], "tp_sizes": [4, 16], "sparse_block": 1024, "items_per_length": 2, "value_digits": 2}
FAULT = "padding_not_zeroed"
PROBES = ["longctx_passkey", "longctx_multikey", "longctx_vartrack"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("longctx")
    cfg = yaml.safe_load(default_config().read_text())
    ref = cfg["reference"]
    other = next(n for n in cfg["variants"] if n != ref)
    cfg["variants"][f"fault-{FAULT}"] = {"env": {"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": FAULT}}
    cfg["noise_floor"] = False
    cfg["longctx"] = SPEC
    cfg["output"] = str(tmp / "runs")
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe", "run", ",".join(PROBES), "-c", str(path), "--run-id", "lc"],
        cwd=tmp, capture_output=True, text=True, timeout=1800,
    )
    return {"proc": proc, "dir": tmp / "runs" / "lc", "ref": ref, "other": other}


def comparison(run, name):
    data = json.loads((run["dir"] / "compare.json").read_text())
    return next(c for c in data["comparisons"] if c["variant"] == name)


def test_run_finishes_divergent_because_of_the_fault(run):
    proc = run["proc"]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert artifacts.read_json(run["dir"] / "run.json")["verdict"] == "DIVERGENT"


def test_prompts_have_exactly_the_target_lengths_including_the_edge_cases(run):
    expected = sorted(n for n, _, _ in target_lengths(LongCtxSpec(**SPEC)))
    assert expected == [1023, 1024, 1025, 1027, 1039]
    samples = artifacts.read_table(artifacts.VariantDir(run["dir"] / run["ref"]).samples)
    for probe in PROBES:
        rows = samples.filter(pc.equal(samples["task"], probe)).to_pylist()
        assert sorted({r["target_length"] for r in rows}) == expected, probe
        for r in rows:
            # what the engine was given, token for token
            assert len(r["prompt_token_ids"]) == r["target_length"], (probe, r["doc_id"])
            assert r["cluster"] and 0 <= r["depth"] <= 1
        edge = {r["target_length"]: r["length_tags"] for r in rows if r["length_kind"] == "edge"}
        assert "tp4:3" in edge[1027] and "tp16:15" in edge[1039] and "block-1" in edge[1023]


def test_the_builtin_model_retrieves_pass_keys(run):
    # The built-in model is trained on the passkey format (2-digit keys, up to 2048
    # tokens): it must find the key at these lengths, so the scores compare something.
    samples = artifacts.read_table(artifacts.VariantDir(run["dir"] / run["ref"]).samples)
    rows = samples.filter(pc.equal(samples["task"], "longctx_passkey")).to_pylist()
    correct = [r["score:exact_match,none"] for r in rows]
    assert len(correct) == 10 and sum(correct) > 0, correct


def test_teacher_forcing_keeps_bounded_prompt_positions(run):
    teacher = artifacts.read_table(artifacts.VariantDir(run["dir"] / run["other"]).teacher)
    pos = teacher["pos"].to_numpy()
    assert (pos < 0).any(), "prompts of 1024+ tokens keep prompt positions"
    per_sample = teacher.group_by(["task", "doc_id", "repeat"]).aggregate([("pos", "count")])
    assert max(per_sample["pos_count"].to_pylist()) < 600, "a bounded subset, not every position"


def test_sp_is_equivalent_to_legacy_on_every_probe(run):
    c = comparison(run, run["other"])
    assert c["status"] in ("IDENTICAL", "EQUIVALENT"), c["reasons"]
    for t in c["teacher"]:
        assert t["n_top1_hard"] == 0 and (t["kl_max"] or 0) < 1e-6, t


def test_padding_fault_is_divergent_with_evidence(run):
    c = comparison(run, f"fault-{FAULT}")
    assert c["status"] == "DIVERGENT"
    failed = [g for g in c["gates"] if g["status"] == "fail"]
    assert failed and all(g["evidence"] for g in failed), failed


def test_per_length_rows_show_where_the_padding_fault_bites(run):
    # The fault corrupts the last real token of a batch that is not a multiple of the
    # rank count: the per-length breakdown must place its divergences on edge-case lengths.
    c = comparison(run, f"fault-{FAULT}")
    entries = {e["task"]: e for e in c["by_length"]}
    assert set(entries) == set(PROBES)
    edge_hard = sum(r["free"]["n_hard_divergences"] for e in entries.values() for r in e["lengths"] if r["length_kind"] == "edge")
    assert edge_hard > 0, [(r["target_length"], r["free"]) for e in entries.values() for r in e["lengths"]]
    for e in entries.values():
        assert [r["target_length"] for r in e["lengths"]] == [1023, 1024, 1025, 1027, 1039]
    # and the A/B of the correct layout is clean at every length
    for e in comparison(run, run["other"])["by_length"]:
        assert all(r["free"]["n_hard_divergences"] == 0 for r in e["lengths"]), e["task"]
    report = (run["dir"] / "report.md").read_text()
    assert "Per length: longctx\\_passkey" in report
