"""The engine-path scenarios (configs/scenarios.yaml) on the real engine: what only vLLM shows.

One run of the scenarios group: legacy, its A/A run, sp, sp with vLLM's prefix cache
switched off (`sp_nocache`), and sp with the zoo's `recompute_error` (`sp_recompute`: wrong
only where the engine recomputes a preempted request). Each scenario's path must show in vLLM's own counters (per
task, in each variant's manifest) or in the path probes' forward passes:

- preemptions of the 24-request burst under the 18-block KV cache;
- prefix-cache hits on the shared document in every variant that caches; none, and so an
  INCONCLUSIVE comparison naming the scenario and the counter, where caching is off;
- one-token engine steps of the one-at-a-time GSM8K task;
- prompts longer than the 512-token prefill chunk, prefilled in whole 512-token passes;
- prompts that fill the 2048-token window up to the answer's room;
- legacy against sp EQUIVALENT, with that evidence in its reasons, and every task's own
  verdict a pass; without the cache only the prefix scenario is INCONCLUSIVE;
- the recompute fault DIVERGENT in the preemption scenario alone: the scheduler's resumed
  requests reach the model (evalpipe.lab.layout.resumed), and only that path shows it;
- speculative decoding (configs/speculative.yaml, vLLM's n-gram proposer): drafts accepted
  in both variants, verified in multi-token passes, EQUIVALENT.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evalpipe.install import shipped_dir

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 3  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

SP = {"EVALPIPE_LAYOUT": "sp"}
SP_EXPECT = {"called": ["evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention"],
             "not_called": ["evalpipe.lab.layout.model.LayoutDecoderLayer._legacy_attention"],
             "per_forward": {"all_to_all": 3, "reduce_scatter": 3, "all_gather": 0}}


@pytest.fixture(scope="module")
def scenario_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("scenarios")
    cfg = {"extends": str(shipped_dir("configs") / "scenarios.yaml"), "output": str(tmp / "runs"),
           "variants": {"sp_nocache": {"env": SP, "engine": {"enable_prefix_caching": False}, "expect": SP_EXPECT},
                        "sp_recompute": {"env": {**SP, "EVALPIPE_LAYOUT_FAULT": "recompute_error"}, "expect": SP_EXPECT}}}
    path = tmp / "scenarios.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "scenarios", "-c", str(path), "--run-id", "scen"],
                          cwd=tmp, capture_output=True, text=True, timeout=1500)
    run_dir = tmp / "runs" / "scen"
    assert (run_dir / "compare.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"proc": proc, "dir": run_dir, "compare": json.loads((run_dir / "compare.json").read_text())}


def comparison(run: dict, variant: str) -> dict:
    return next(c for c in run["compare"]["comparisons"] if c["variant"] == variant)


def counters(run: dict, variant: str) -> dict:
    return json.loads((run["dir"] / variant / "manifest.json").read_text())["engine_counters"]


def test_legacy_against_sp_is_equivalent_with_every_scenarios_evidence(scenario_run):
    sp = comparison(scenario_run, "sp")
    assert sp["status"] == "EQUIVALENT", sp["reasons"]
    assert sp["paths"]["status"] == "verified"
    evidence = " ".join(sp["paths"]["reasons"])
    for side in ("legacy", "sp"):
        side_evidence = next(r for r in sp["paths"]["reasons"] if r.startswith(f"{side}:"))
        assert "task `scenario_prefix_cache`:" in side_evidence and "prefix-cache hit tokens" in side_evidence
        assert "task `gsm8k_synth_4shot`:" in side_evidence and "engine steps of 1 token" in side_evidence
        # vLLM counts a chunked prefill as one step of the whole prompt: over the 512-token budget
        assert "task `scenario_chunked_prefill`: 10 engine steps of 513-1024 tokens" in side_evidence
    assert "forward passes of 512-1023 tokens" in evidence
    tasks = {row["task"] for row in sp["tokens"]}
    assert tasks == {"scenario_prefix_cache", "scenario_chunked_prefill", "scenario_near_limit", "scenario_preemption",
                     "gsm8k_synth_4shot"}
    assert {t["task"] for t in sp["tasks"]} == tasks
    assert {t["status"] for t in sp["tasks"]} <= {"EQUIVALENT", "IDENTICAL"}, sp["tasks"]


def test_every_variant_that_caches_hit_the_shared_document_after_the_first_request(scenario_run):
    for variant in ("legacy", "legacy-aa", "sp"):
        prefix = counters(scenario_run, variant)["scenario_prefix_cache"]
        # 16 prompts of 1024 tokens; the 15 sent after the first find its whole 128-token blocks cached
        assert prefix["prompt_tokens"] == 16 * 1024, variant
        assert prefix["prefix_cache_hits"] >= 15 * 6 * 128, (variant, prefix)
        alone = counters(scenario_run, variant)["gsm8k_synth_4shot"]["steps_by_tokens"]
        assert alone.get("1", 0) >= 20, (variant, alone)
        assert counters(scenario_run, variant)["scenario_preemption"]["preemptions"] >= 1, variant


def test_without_the_prefix_cache_the_comparison_is_inconclusive_naming_the_scenario_and_the_counter(scenario_run):
    nocache = comparison(scenario_run, "sp_nocache")
    assert counters(scenario_run, "sp_nocache")["scenario_prefix_cache"]["prefix_cache_hits"] == 0
    assert nocache["status"] == "INCONCLUSIVE"
    assert nocache["outputs_status"] in ("EQUIVALENT", "IDENTICAL"), "the outputs agree: only the path is missing"
    assert any(r.startswith("variant `sp_nocache`: task `scenario_prefix_cache` was to drive >= 1 prefix-cache hit tokens; "
                            "vLLM counted 0") for r in nocache["reasons"]), nocache["reasons"]
    # beside the DIVERGENT sp_recompute the run is DIVERGENT (documents.comparison's severity order)
    assert scenario_run["proc"].returncode == 1
    # the scenario alone: the tasks beside it keep what their outputs showed
    own = {t["task"]: t["status"] for t in nocache["tasks"]}
    assert own.pop("scenario_prefix_cache") == "INCONCLUSIVE"
    assert set(own.values()) <= {"EQUIVALENT", "IDENTICAL"}, own


def test_the_chunked_and_near_limit_prompts_have_their_lengths_and_were_prefilled_in_whole_chunks(scenario_run):
    data = Path(json.loads((scenario_run["dir"] / "sp" / "manifest.json").read_text())["data_files"]
                ["scenario_chunked_prefill"]["test"]["path"])
    lengths = sorted(json.loads(line)["length"] for line in data.read_text().splitlines())
    assert lengths == [512 + o for o in (1, 3, 4, 5, 15, 16, 17, 127, 128, 129)]
    near = Path(json.loads((scenario_run["dir"] / "sp" / "manifest.json").read_text())["data_files"]
                ["scenario_near_limit"]["test"]["path"])
    assert sorted(json.loads(line)["length"] for line in near.read_text().splitlines()) == [2048 - 17, 2048 - 16]
    probes = json.loads((scenario_run["dir"] / "sp" / "manifest.json").read_text())["probes"]
    # no engine step holds more than the 512-token budget: the 512-1023 bin holds the whole chunks
    assert probes["tokens_per_forward"]["512"] >= 10
    assert not {k for k in probes["tokens_per_forward"] if k.isdigit() and int(k) > 512}


def test_a_fault_only_in_the_recompute_after_preemption_is_divergent_in_the_preemption_scenario_alone(scenario_run):
    faulty = comparison(scenario_run, "sp_recompute")
    assert counters(scenario_run, "sp_recompute")["scenario_preemption"]["preemptions"] >= 1
    assert faulty["status"] == "DIVERGENT", faulty["reasons"]
    own = {t["task"]: t["status"] for t in faulty["tasks"]}
    assert own.pop("scenario_preemption") == "DIVERGENT", faulty["tasks"]
    assert set(own.values()) <= {"EQUIVALENT", "IDENTICAL"}, own


@pytest.fixture(scope="module")
def speculative_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("speculative")
    cfg = {"extends": str(shipped_dir("configs") / "speculative.yaml"), "output": str(tmp / "runs")}
    path = tmp / "speculative.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "speculative", "-c", str(path), "--run-id", "spec",
                           "--no-noise-floor"], cwd=tmp, capture_output=True, text=True, timeout=1500)
    run_dir = tmp / "runs" / "spec"
    assert (run_dir / "compare.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"proc": proc, "dir": run_dir, "compare": json.loads((run_dir / "compare.json").read_text())}


def test_speculative_decoding_accepts_drafts_in_both_variants_and_keeps_the_outputs(speculative_run):
    sp = comparison(speculative_run, "sp")
    assert sp["status"] in ("EQUIVALENT", "IDENTICAL"), sp["reasons"]
    assert sp["paths"]["status"] == "verified"
    for variant in ("legacy", "sp"):
        counted = counters(speculative_run, variant)["scenario_speculative"]
        assert 0 < counted["spec_decode_accepted_tokens"] <= counted["spec_decode_draft_tokens"], (variant, counted)
        side = next(r for r in sp["paths"]["reasons"] if r.startswith(f"{variant}:"))
        assert "accepted draft tokens" in side and "forward passes of 4-7 tokens" in side
