"""End to end on the real engine (vLLM's CPU build) with the built-in model: no mocks.

One run of four variants serves the whole module (engine starts dominate the cost):
  batched  the default config's reference
  chunked  the default config's other variant (chunked prefill forced)
  again    the reference's exact settings a second time  -> must be IDENTICAL
  bf16     the positive control's bfloat16 variant       -> must be DIFFERENT
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml

from evalpipe import artifacts
from evalpipe.config import DEFAULT_CONFIG, load_config

pytestmark = pytest.mark.slow

LIMIT = 24
CONFIGS = DEFAULT_CONFIG.parent


def evalpipe(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evalpipe", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("e2e")
    default = yaml.safe_load(DEFAULT_CONFIG.read_text())
    control = yaml.safe_load((CONFIGS / "dtype_control.yaml").read_text())
    ref = default["reference"]
    other = next(n for n in default["variants"] if n != ref)
    cfg = dict(default)
    cfg["variants"] = {
        ref: default["variants"][ref],
        other: default["variants"][other],
        "again": default["variants"][ref],
        "bf16": {"engine": {**default["variants"][ref].get("engine", {}), **control["variants"]["bf16"]["engine"]}},
    }
    cfg["output"] = str(tmp / "runs")
    path = tmp / "e2e.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "e2e", cwd=tmp)
    run_dir = tmp / "runs" / "e2e"
    return {"proc": proc, "dir": run_dir, "ref": ref, "other": other, "tmp": tmp, "config": load_config(path)}


def variant_names(run) -> list[str]:
    return [run["ref"], run["other"], "again", "bf16"]


def comparison(run, name: str) -> dict:
    data = json.loads((run["dir"] / "compare.json").read_text())
    return next(c for c in data["comparisons"] if c["variant"] == name)


def test_run_finishes_and_exits_1_because_bf16_differs(run):
    proc = run["proc"]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    info = json.loads((run["dir"] / "run.json").read_text())
    assert info["status"] == "ok" and info["verdict"] == "DIFFERENT"
    assert info["model"]["builtin"] and len(info["model"]["fingerprint"]) == 64
    assert info["versions"]["vllm"] and info["hardware"]["cpus"]
    assert info["variant_settings"]["bf16"]["versions"] == info["versions"], "one environment, same versions"
    # progress was visible: which variant, which task, how far
    for name in variant_names(run):
        assert f"variant {name}" in proc.stdout
    assert f"gsm8k_synth_4shot · generate: {LIMIT}/{LIMIT}" in proc.stdout


def test_every_variant_has_all_artifacts(run):
    for name in variant_names(run):
        vdir = artifacts.VariantDir(run["dir"] / name)
        for path in (vdir.manifest, vdir.results, vdir.samples, vdir.tokens, vdir.engine_log):
            assert path.is_file() and path.stat().st_size > 0, path
        manifest = artifacts.read_json(vdir.manifest)
        assert manifest["status"] == "ok"
        assert manifest["versions"]["vllm"] and manifest["versions"]["lm_eval"] == "0.4.13"
        assert manifest["timings"]["engine_start_s"] > 0
        assert manifest["truncated_prompts"] == 0
        assert manifest["data_files"]["gsm8k_synth_4shot"]["test"]["sha256"]
        results = artifacts.read_json(vdir.results)
        task = results["results"]["gsm8k_synth_4shot"]
        assert 0.0 <= task["exact_match,strict-match"] <= 1.0
        assert results["n-samples"]["gsm8k_synth_4shot"]["effective"] == LIMIT
    for path in (run["dir"] / "compare.json", run["dir"] / "report.md"):
        assert path.is_file()


def test_tokens_line_up_with_samples(run):
    from transformers import AutoTokenizer

    info = json.loads((run["dir"] / "run.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(info["model"]["path"])
    vdir = artifacts.VariantDir(run["dir"] / run["ref"])
    samples = artifacts.read_table(vdir.samples).to_pylist()
    tokens = artifacts.read_table(vdir.tokens)
    assert len(samples) == LIMIT
    assert tokens.num_rows == sum(s["n_tokens"] for s in samples)
    for s in samples:
        mine = tokens.filter(pc.equal(tokens["doc_id"], s["doc_id"])).to_pydict()
        assert mine["pos"] == list(range(s["n_tokens"]))
        assert s["n_tokens"] > 0
        # The text lm-eval scored is what these tokens decode to (vLLM cuts the stop string off the text).
        assert tokenizer.decode(mine["token_id"]).startswith(s["response"])
        for tid, lp, top_ids, top_lps in zip(mine["token_id"], mine["logprob"], mine["topk_ids"], mine["topk_logprobs"]):
            assert len(top_ids) == run["config"].capture.topk
            assert top_lps == sorted(top_lps, reverse=True)
            assert tid == top_ids[0] and lp == top_lps[0], "greedy decoding picks the top-1 token"


def test_identical_settings_are_identical(run):
    c = comparison(run, "again")
    assert c["status"] == "IDENTICAL", c["reasons"]


def test_default_config_variants_are_identical(run):
    # The default config's claim: forcing chunked prefill does not change outputs here.
    c = comparison(run, run["other"])
    assert c["status"] == "IDENTICAL", c["reasons"]


def test_dtype_control_is_different_with_reasons(run):
    c = comparison(run, "bf16")
    assert c["status"] == "DIFFERENT"
    assert c["reasons"], "a DIFFERENT verdict says why"
    tok = c["tokens"][0]
    assert tok["max_abs_dlogprob"] > 1e-4, "bf16 moves logprobs far beyond fp32 noise"


def test_compare_reruns_from_artifacts_byte_identically(run, tmp_path):
    first = (run["dir"] / "compare.json").read_bytes()
    out = tmp_path / "again"
    proc = evalpipe("compare", str(run["dir"]), "--output", str(out), cwd=tmp_path)
    assert proc.returncode == 1
    assert (out / "compare.json").read_bytes() == first
    same = evalpipe("compare", str(run["dir"]), "--variants", f"{run['ref']},again", "--output", str(tmp_path / "s"), cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    diff = evalpipe("compare", str(run["dir"]), "--variants", f"{run['ref']},bf16", "--output", str(tmp_path / "d"), cwd=tmp_path)
    assert diff.returncode == 1
