"""configs/sp_moe.yaml end to end: vLLM's own DeepseekV2DecoderLayer on the built-in
tiny-moe at data parallel 2 x tensor parallel 2 + expert parallel, served (8 engine
processes, real collectives), with evalpipe's CPU workarounds. One run of the three
variants (no A/A: its floor is the numerics floor), then `evalpipe localize` with decode
steps; docs/sp-moe.md explains what is asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import in_process
import pytest
import yaml

from evalpipe.install import default_config

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 8.5  # alone on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 4


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sp_moe")
    cfg = {
        "extends": str(default_config().with_name("sp_moe.yaml")),
        "output": str(tmp / "runs"),
        "noise_floor": False,
        "localize": "off",
    }
    path = tmp / "sp_moe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = in_process.evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "sp", cwd=tmp)
    run_dir = tmp / "runs" / "sp"
    loc = in_process.evalpipe("localize", str(run_dir), "--variant", "sp", "--samples", "1", "--decode-steps", "2", cwd=tmp)
    return {"run": run, "localize": loc, "dir": run_dir}


def _verdicts(run_dir: Path) -> dict[str, str]:
    compare = json.loads((run_dir / "compare.json").read_text())
    return {c["variant"]: c["status"] for c in compare["comparisons"]}


def test_sp_is_divergent_and_its_fix_equivalent(sp_run):
    run = sp_run["run"]
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]  # the verdict's code: DIVERGENT
    assert _verdicts(sp_run["dir"]) == {"sp": "DIVERGENT", "sp_fixed": "EQUIVALENT"}
    compare = json.loads((sp_run["dir"] / "compare.json").read_text())
    sp = next(c for c in compare["comparisons"] if c["variant"] == "sp")
    failed = {g["gate"] for g in sp["gates"] if g["status"] == "fail"}
    assert "free_hard_divergences" in failed or "free_kl_max" in failed, failed
    # teacher forcing is prefill, many tokens per forward pass: there the layouts agree
    assert not {"teacher_kl_p99", "teacher_kl_max", "teacher_hard_top1_flips"} & failed, failed


def _worker_forwards(run_dir: Path, variant: str) -> list[dict]:
    probes = json.loads((run_dir / variant / "probes.json").read_text())
    return [m for p in probes["processes"] if p["role"] == "worker" for m in p["models"]]


def test_the_probes_show_sp_exactly_where_vllm_puts_it_and_the_skipped_gathers(sp_run):
    """Every worker of every variant holds its switches; sp's all-gathers over TP are missing
    in exactly the one-token forward passes, sp_fixed's never."""
    run_dir = sp_run["dir"]
    replicated = _worker_forwards(run_dir, "replicated")
    assert len(replicated) == 4 and all(m["per_forward"]["all_reduce@tp"] == {"7": m["forwards"]} for m in replicated)
    sp = _worker_forwards(run_dir, "sp")
    assert len(sp) == 4
    for m in sp:
        gathers = m["per_forward"]["all_gather@tp"]  # forwards with 2 gathers; the rest have none
        without = m["forwards"] - gathers.get("2", 0)
        assert without > 0 and m["per_forward"]["reduce_scatter@tp"] == {"2": m["forwards"]}
        # the passes without them held exactly one token each; those with them, more
        ranges = m["per_forward_token_range"]["all_gather@tp"]
        assert ranges["0"] == [1, 1] and ranges["2"][0] >= 2, ranges
    fixed = _worker_forwards(run_dir, "sp_fixed")
    assert all(m["per_forward"]["all_gather@tp"] == {"2": m["forwards"]} for m in fixed)


def test_localize_with_decode_steps_names_layer_2s_attention(sp_run):
    loc = sp_run["localize"]
    assert loc.returncode == 0, loc.stdout[-3000:] + loc.stderr[-3000:]
    doc = json.loads((sp_run["dir"] / "localize.json").read_text())["localizations"][0]
    assert doc["variant"] == "sp" and doc["reference"] == "replicated"
    first = doc["first"]
    assert first is not None and first["layer"] == 2 and first["module"].startswith("attn"), first
    # the layers before it agree at the decode rows: the fault is where SP's second MoE layer
    # takes its one-row shard for the whole batch
    earlier = [m for m in doc["modules"] if m["layer"] < 2 and m["rows"] > 0]
    assert earlier and all(m["rel_l2"] <= m["floor"] for m in earlier), earlier
    assert doc["not_reassembled"] == []


def test_sampling_catches_the_single_token_bug_too(tmp_path):
    """The same bug under sampled decoding with common random numbers (temperature 0.6, two
    samples per item, seeded alike on both sides): the one-token forward passes still draw
    from another distribution, so sp's samples leave the replicated layout's."""
    cfg = {
        "extends": str(default_config().with_name("sp_moe.yaml")),
        "output": str(tmp_path / "runs"),
        "noise_floor": False,
        "localize": "off",
        "sampling": {"temperature": 0.6, "samples": 2},
    }
    path = tmp_path / "sampled.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = in_process.evalpipe("run", "gsm8k", "-c", str(path), "--limit", "3", "--run-id", "sampled",
                              "--variants", "replicated,sp", cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]  # DIVERGENT
    run_dir = tmp_path / "runs" / "sampled"
    assert _verdicts(run_dir) == {"sp": "DIVERGENT"}
    compare = json.loads((run_dir / "compare.json").read_text())
    (sp,) = compare["comparisons"]
    assert sp["samples"] == {"a": 6, "b": 6}
    failed = {g["gate"] for g in sp["gates"] if g["status"] == "fail"}
    assert "free_hard_divergences" in failed or "free_kl_max" in failed, failed
