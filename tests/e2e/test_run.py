"""End to end on the real engine (vLLM's CPU build) with the built-in model: no mocks.

One run of four engines serves the whole module (engine starts dominate the cost):
  legacy      the default config's reference (the layout model's legacy path)
  legacy-aa   the A/A noise floor: the reference's numerics again, requests reversed and
              max_num_seqs halved                         -> last-bit differences at most
  sp          the default config's other variant (sequence-parallel pass-through)
                                                          -> IDENTICAL or EQUIVALENT
  bf16        the positive control's bfloat16 variant     -> DIVERGENT under the default gates
              (the reference is fp32, so the fp32 floors apply), EQUIVALENT under gates
              with half-precision floors: gates are policy, the evidence is the same
  sp_fallback `sp`'s settings and expectations, but the layer silently takes the legacy path
              (the zoo's `sp_fallback`)                   -> INCONCLUSIVE: its outputs are the
              reference's exactly, only the path probes can tell
Every variant also teacher-forces the reference's sequences (teacher.parquet).

The default A/B (legacy, its A/A run and sp) runs a second time on a real three-node Ray
cluster on 127.0.0.1, each variant on a node of its own, and must give this run's verdicts,
byte-identical tables and the same path evidence (every engine process's probe records back
from its node): the local side of that comparison is this module's run, not another start.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml
from processes import wait_gone
from ray_cluster import leftovers, local_cluster

from evalpipe.config.loading import load_config
from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.install import default_config
from evalpipe.rundir import artifacts
from evalpipe.rundir.integrity import sha256_of, verify_variant

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 7  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 24
CONFIGS = default_config().parent


def evalpipe(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evalpipe", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("e2e")
    default = yaml.safe_load(default_config().read_text())
    control = yaml.safe_load((CONFIGS / "dtype_control.yaml").read_text())
    ref = default["reference"]
    other = next(n for n in default["variants"] if n != ref)
    cfg = dict(default)
    cfg["variants"] = {
        ref: default["variants"][ref],
        other: default["variants"][other],
        "bf16": {
            "env": default["variants"][ref].get("env", {}),
            "engine": {**default["variants"][ref].get("engine", {}), **control["variants"]["bf16"]["engine"]},
        },
        "sp_fallback": {
            "env": {**default["variants"][other]["env"], "EVALPIPE_LAYOUT_FAULT": "sp_fallback"},
            "expect": default["variants"][other]["expect"],
        },
    }
    cfg["noise_floor"] = True
    cfg["output"] = str(tmp / "runs")
    path = tmp / "e2e.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "e2e", cwd=tmp)
    run_dir = tmp / "runs" / "e2e"
    return {"proc": proc, "dir": run_dir, "ref": ref, "other": other, "tmp": tmp, "config": load_config(path)}


def variant_names(run) -> list[str]:
    return [run["ref"], f"{run['ref']}-aa", run["other"], "bf16", "sp_fallback"]


def comparison(run, name: str) -> dict:
    data = json.loads((run["dir"] / "compare.json").read_text())
    return next(c for c in data["comparisons"] if c["variant"] == name)


def test_run_finishes_and_the_bf16_control_makes_it_divergent(run):
    proc = run["proc"]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    info = json.loads((run["dir"] / "run.json").read_text())
    assert info["status"] == "ok" and info["verdict"] == "DIVERGENT"
    assert info["noise_floor"]["variant"] == f"{run['ref']}-aa"
    assert info["model"]["builtin"] and len(info["model"]["fingerprint"]) == 64
    assert info["versions"]["vllm"] and info["hardware"]["cpus"]
    assert info["variant_settings"]["bf16"]["versions"] == info["versions"], "one environment, same versions"
    # progress was visible: which variant, which task, how far
    for name in variant_names(run):
        assert f"variant {name}" in proc.stdout
    assert f"gsm8k_synth_4shot · generate: {LIMIT}/{LIMIT}" in proc.stdout


def test_the_run_is_recorded_in_the_history(run):
    from evalpipe.history.store import open_history

    db_file = run["tmp"] / "runs" / "history.sqlite"
    assert db_file.is_file(), "evalpipe run records into history.sqlite under the output root"
    hist = open_history(None, run["tmp"] / "runs")
    rec = hist.run("e2e")
    assert rec.kind == "run" and rec.verdict == "DIVERGENT" and rec.model_fingerprint
    variants = {v.name: v for v in hist.variants_of("e2e")}
    assert sorted(variants) == sorted(variant_names(run))
    assert variants["bf16"].status == "DIVERGENT" and variants[f"{run['ref']}-aa"].role == "aa"
    assert variants[run["ref"]].components["vllm"] == artifacts.read_json(run["dir"] / run["ref"] / "manifest.json")["versions"]["vllm"]
    rows = [r for r in hist.score_rows(["e2e"], with_items=True) if r.variant == run["ref"]]
    assert rows and all(r.n == LIMIT and len(r.items) == LIMIT for r in rows)


def test_every_variant_has_all_artifacts(run):
    for name in variant_names(run):
        vdir = artifacts.VariantDir(run["dir"] / name)
        for path in (vdir.manifest, vdir.results, vdir.samples, vdir.tokens, vdir.teacher, vdir.engine_log):
            assert path.is_file() and path.stat().st_size > 0, path
        # each worker was forked from the run's pre-imported interpreter (evalpipe/execution/preimport.py),
        # not refused back into a new one
        assert "forked from a pre-imported interpreter" in vdir.engine_log.read_text(errors="replace"), name
        manifest = artifacts.read_json(vdir.manifest)
        assert manifest["status"] == "ok"
        assert manifest["versions"]["vllm"] and manifest["versions"]["lm_eval"] == "0.4.13"
        assert manifest["timings"]["engine_start_s"] > 0 and manifest["timings"]["teacher_s"] > 0
        assert manifest["truncated_prompts"] == 0
        assert manifest["data_files"]["gsm8k_synth_4shot"]["test"]["sha256"]
        # verified artifacts: what compare and the history read is recorded, and still matches
        assert {"job.json", "results.json", "samples.parquet", "tokens.parquet", "teacher.parquet"} <= set(manifest["artifacts"])
        assert manifest["artifacts"]["samples.parquet"]["rows"] == LIMIT
        from evalpipe.rundir.integrity import verify_variant

        verify_variant(vdir)
        results = artifacts.read_json(vdir.results)
        task = results["results"]["gsm8k_synth_4shot"]
        assert 0.0 <= task["exact_match,strict-match"] <= 1.0
        assert results["n-samples"]["gsm8k_synth_4shot"]["effective"] == LIMIT
    for name in ("compare.json", "report.md", "report.html", "junit.xml"):
        assert (run["dir"] / name).is_file(), name


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


def test_teacher_forcing_scores_the_references_exact_continuations(run):
    key = [("doc_id", "ascending"), ("pos", "ascending")]
    ref_tokens = artifacts.read_table(artifacts.VariantDir(run["dir"] / run["ref"]).tokens).sort_by(key)
    for name in variant_names(run):
        teacher = artifacts.read_table(artifacts.VariantDir(run["dir"] / name).teacher).sort_by(key)
        assert teacher.num_rows == ref_tokens.num_rows
        assert teacher["token_id"].to_pylist() == ref_tokens["token_id"].to_pylist(), "forced tokens are the reference's"
        assert all(len(t) == run["config"].capture.topk for t in teacher["topk_ids"].to_pylist())
        assert teacher["token_text"].null_count == 0
    # The reference scoring its own continuation in one prefill must reproduce the
    # logprobs it saw while decoding: a shifted position would be off by whole nats.
    own = artifacts.read_table(artifacts.VariantDir(run["dir"] / run["ref"]).teacher).sort_by(key)
    diffs = [abs(a - b) for a, b in zip(own["logprob"].to_pylist(), ref_tokens["logprob"].to_pylist())]
    assert max(diffs) < 1e-4


def test_noise_floor_run_moves_in_the_last_bits_at_most(run):
    # Same numerics, other batch arrangement: only float summation order may move (the
    # layout model's matmuls see other batch shapes), never a token.
    data = json.loads((run["dir"] / "compare.json").read_text())
    aa = data["noise_floor"]
    assert aa["variant"] == f"{run['ref']}-aa"
    assert aa["status"] in ("IDENTICAL", "EQUIVALENT"), aa["reasons"]
    assert f"{run['ref']}-aa" not in [c["variant"] for c in data["comparisons"]]
    assert_last_bits_only(aa)


def assert_last_bits_only(c: dict) -> None:
    for free, teacher in zip(c["tokens"], c["teacher"]):
        assert free["n_hard_divergences"] == 0 and teacher["n_top1_hard"] == 0
        assert teacher["max_abs_dlogprob"] < 1e-4 and (teacher["kl_max"] or 0) < 1e-6, teacher


def test_default_config_variants_are_equivalent(run):
    # The default config's claim: the sp pass-through computes what legacy computes; in
    # fp32 the two summation orders differ in the last bits only.
    c = comparison(run, run["other"])
    assert c["status"] in ("IDENTICAL", "EQUIVALENT"), c["reasons"]
    assert all(g["status"] == "pass" for g in c["gates"]), c["gates"]
    assert {g["gate"] for g in c["gates"]} >= {"teacher_dlogprob_shift", "teacher_kl_shift"}, "evaluated, not skipped"
    assert_last_bits_only(c)


def test_the_default_pass_carries_what_each_variant_ran(run):
    """legacy vs sp passes with positive evidence: each ran its declared path (the layout
    model, its own attention path, its collectives in every forward pass), shown side by side."""
    c = comparison(run, run["other"])
    assert c["paths"]["status"] == "verified" and c["paths"]["same_profile"] is False, c["paths"]
    a, b = c["paths"]["what_ran"]["a"], c["paths"]["what_ran"]["b"]
    assert a["models"] == b["models"] == ["evalpipe.lab.layout.model.LayoutForCausalLM"]
    assert set(a["collectives_per_forward"]) == {"all_gather", "reduce_scatter"}
    assert set(b["collectives_per_forward"]) == {"all_to_all", "reduce_scatter"}
    for kind, entry in b["collectives_per_forward"].items():
        assert entry["counts"] == {"3": entry["forwards"]}, (kind, entry)  # one per layer, every forward pass
    report = (run["dir"] / "report.md").read_text()
    assert "What ran" in report and "LayoutForCausalLM" in report
    suites = ET.parse(run["dir"] / "junit.xml").getroot()
    (case,) = [t for s in suites if s.get("name").endswith(f"-vs-{run['other']}") for t in s
               if t.get("classname") == f"{run['other']}.path"]
    assert case.find("failure") is None


def test_a_silent_fallback_to_the_legacy_path_is_inconclusive(run):
    """The trap of PR #18671: the new layer falls back to the old path when a condition
    fails, the outputs are the reference's exactly, and an output comparison signs it off.
    The probes see the legacy path run where `sp` declares its own."""
    c = comparison(run, "sp_fallback")
    assert c["status"] == "INCONCLUSIVE" and c["outputs_status"] == "IDENTICAL", c["reasons"]
    reasons = " ".join(c["reasons"])
    assert "never called `evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention`" in reasons
    assert "called `evalpipe.lab.layout.model.LayoutDecoderLayer._legacy_attention`" in reasons
    assert "all_to_all" in reasons
    suites = ET.parse(run["dir"] / "junit.xml").getroot()
    (suite,) = [s for s in suites if s.get("name").endswith("-vs-sp_fallback")]
    failures = [t for t in suite if t.find("failure") is not None]
    assert [t.get("classname") for t in failures] == ["sp_fallback.path"], "the outputs' gates all pass; the path fails"
    # the run's verdict stays the worst finding: the bf16 control's divergence
    assert json.loads((run["dir"] / "run.json").read_text())["verdict"] == "DIVERGENT"


def test_a_forgotten_plugin_line_is_inconclusive_naming_the_missing_path(run):
    """The trap a new user walks into: the default config without the `architectures` line.
    vLLM serves the plain Llama to both variants, EVALPIPE_LAYOUT reaches no code, the
    outputs are IDENTICAL; evalpipe must not call that a pass."""
    tmp = run["tmp"]
    cfg = tmp / "forgot.yaml"
    cfg.write_text(yaml.safe_dump({"extends": str(default_config()), "output": str(tmp / "runs"),
                                   "engine": {"hf_overrides": {"architectures": None}}}))
    proc = evalpipe("run", "gsm8k", "-c", str(cfg), "--limit", "4", "--no-noise-floor", "--run-id", "forgot", cwd=tmp)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())
    assert "INCONCLUSIVE" in out
    assert "instantiated `vllm.model_executor.models.llama.LlamaForCausalLM`" in out
    assert "never called `evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention`" in out
    c = json.loads((tmp / "runs" / "forgot" / "compare.json").read_text())["comparisons"][0]
    assert c["outputs_status"] == "IDENTICAL" and c["paths"]["status"] == "failed"


def test_default_gates_know_the_reference_is_fp32_and_catch_the_bf16_control(run):
    c = comparison(run, "bf16")
    assert c["status"] == "DIVERGENT", c["reasons"]
    assert c["numerics"]["dtype"] == "float32" and c["numerics"]["precision"] == "fp32"
    failed = [g for g in c["gates"] if g["status"] == "fail"]
    assert {g["gate"] for g in failed} >= {"teacher_kl_p99", "teacher_kl_max"}
    for g in failed:
        assert g["measured"] > g["threshold"], g
        assert g["detail"] in c["reasons"]
    kl = next(g for g in failed if g["gate"] == "teacher_kl_p99")
    assert "fp32 floor 1e-09" in kl["detail"] and kl["evidence"]
    assert c["teacher"][0]["max_abs_dlogprob"] > 1e-4, "bf16 moves logprobs far beyond fp32 noise"
    suites = ET.parse(run["dir"] / "junit.xml").getroot()
    (suite,) = [s for s in suites if s.get("name").endswith("-vs-bf16")]
    assert int(suite.get("failures")) == len(failed)
    assert "Numerics: reference in float32" in (run["dir"] / "report.md").read_text()
    # the distributional gates ran against the A/A run and report the effect with its interval
    (shift,) = [g for g in c["gates"] if g["gate"] == "teacher_kl_shift"]
    assert shift["status"] == "fail" and "95% CI [" in shift["detail"] and "sign-flip p" in shift["detail"]
    (test,) = [t for t in c["distribution"] if t["test"] == "kl_shift"]
    assert test["n_samples"] == LIMIT and test["estimate"] > 0 and test["p_value"] < 1e-3


def test_half_precision_floors_in_the_config_accept_the_same_evidence(run, tmp_path):
    # gates are policy: the same artifacts judged with bf16-level floors pass
    half = {"tokens": {g: {"abs": v} for g, v in {"free_kl_max": 0.1, "teacher_kl_p99": 1e-3, "teacher_kl_max": 0.1}.items()},
            "distribution": {"dlogprob_shift": 1e-3, "kl_shift": 1e-4}}
    gates = tmp_path / "half.yaml"
    gates.write_text(yaml.safe_dump({"gates": half}))
    out = tmp_path / "half"
    proc = evalpipe("compare", str(run["dir"]), "--variants", f"{run['ref']},bf16", "--gates", str(gates), "--output", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    c = json.loads((out / "compare.json").read_text())["comparisons"][0]
    assert c["status"] == "EQUIVALENT", c["reasons"]
    assert any("logprobs differ" in r for r in c["reasons"]), "what differs is stated even when it passes"


def test_compare_reruns_from_artifacts_byte_identically(run, tmp_path):
    first = (run["dir"] / "compare.json").read_bytes()
    out = tmp_path / "again"
    proc = evalpipe("compare", str(run["dir"]), "--output", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # DIVERGENT: the bf16 control
    assert (out / "compare.json").read_bytes() == first
    same = evalpipe("compare", str(run["dir"]), "--variants", f"{run['ref']},{run['other']}", "--output", str(tmp_path / "s"), cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr


def test_margin_flag_is_applied_and_recorded(run, tmp_path):
    out = tmp_path / "m"
    proc = evalpipe("compare", str(run["dir"]), "--margin", "0.05", "--output", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads((out / "compare.json").read_text())
    assert data["gates"]["scores"]["margin"] == 0.05
    assert {r["margin"] for c in data["comparisons"] for r in c["scores"]} == {0.05}


# ---------------------------------------------------------------- kill -9 and resume

# (at least 9 answers in its journal: progress is counted after the answer is written)
MID_GENERATION = r"· gsm8k_synth_4shot · generate: (9|\d\d)/"


def run_and_kill_at(args: list[str], cwd: Path, run_id: str, variant: str | None, marker: str,
                    whole_tree: bool = False) -> str:
    """Start `evalpipe run`, SIGKILL it when a line of ``variant``'s output matches
    ``marker`` (with ``whole_tree``, every process of the run at once, as the OOM killer
    of a job's cgroup or a lost node would; else evalpipe alone, and the guards stop its
    workers and servers), wait until every process of the run is gone and return what it
    printed."""
    import os
    import signal

    from processes import processes_of, wait_gone

    err = open(cwd / f"{run_id}.stderr", "w+")  # noqa: SIM115 - read back on failure
    proc = subprocess.Popen([sys.executable, "-m", "evalpipe", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=err, text=True, start_new_session=True)
    seen, current = [], None
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("variant "):
            current = line.split()[1]
        if re.search(marker, line) and (variant is None or current == variant):
            for pid in [proc.pid, *(processes_of(run_id) if whole_tree else [])]:
                try:
                    os.kill(pid, signal.SIGKILL)  # nothing of it gets to clean up
                except ProcessLookupError:
                    pass
            break
    proc.wait()
    err.seek(0)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before `{marker}` of {variant}:\n{''.join(seen)[-3000:]}{err.read()[-3000:]}"
    assert wait_gone(run_id, 60) == [], "processes outlived evalpipe's SIGKILL"
    return "".join(seen)


def cut_journal_short(path: Path, keep: int) -> int:
    """Leave ``path`` as a kill earlier in the task would have: its first ``keep`` answers
    and half of the next line (the kill lands while vLLM's batch of 24 finishes within
    a second, so where it lands among the answers is luck). Returns the answers kept."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) > keep, f"only {len(lines)} answers in the journal when the kill came"
    path.write_text("".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2], encoding="utf-8")
    return keep


def assert_same_but_last_bits(a: Path, b: Path) -> tuple[int, int, float]:
    """Equal tables, except that logprobs may differ in their last bits (the same tokens,
    ranks and texts): what an answer computed in another batch differs by. Returns how
    many of the `logprob` column's values differ, of how many, and by at most how much."""
    import numpy as np
    import pyarrow.parquet as pq

    x, y = pq.read_table(a), pq.read_table(b)
    measured = (0, 0, 0.0)
    assert x.schema == y.schema and x.num_rows == y.num_rows, b
    for name in x.column_names:
        u, v = x.column(name).to_pylist(), y.column(name).to_pylist()
        if "logprob" not in name:
            assert json.dumps(u, default=str) == json.dumps(v, default=str), f"{b}: column {name}"  # NaN equal to NaN
            continue
        flat = [np.ravel(np.asarray(e, dtype=float)) for e in (u, v)] if name == "logprob" else \
            [np.concatenate([np.ravel(np.asarray(r, dtype=float)) for r in col] or [np.zeros(0)]) for col in (u, v)]
        assert flat[0].shape == flat[1].shape, f"{b}: column {name}"
        assert np.array_equal(np.isnan(flat[0]), np.isnan(flat[1])), f"{b}: column {name} (NaN places)"
        diff = np.abs(flat[0] - flat[1])
        assert np.nanmax(diff, initial=0.0) < 1e-5, f"{b}: column {name} differs by {np.nanmax(diff)}"
        if name == "logprob":
            measured = (int(np.count_nonzero(diff > 0)), diff.size, float(np.nanmax(diff, initial=0.0)))
    return measured


def test_a_run_killed_mid_generation_resumes_to_the_uninterrupted_artifacts(run):
    """The real engine's part of a resume: evalpipe SIGKILLed while the second variant
    generates, continued with the same command: the offline engine answers
    from its request journal what vLLM had finished, and the end result is the module's
    uninterrupted run (same config, same items): the kept variant's Parquet files byte for
    byte, the continued one's up to the last bits of the logprobs its engine computed again
    in other batches. results.json may differ in its timing fields only. (Kills at every
    other point of a run, and --resume, are orchestration: tests/pipeline/test_runs_on_the_fake_engine.py.)"""
    tmp, run_id = run["tmp"], "resumed-vllm"
    run_dir = tmp / "runs" / run_id
    args = ["run", "gsm8k", "-c", str(tmp / "e2e.yaml"), "--limit", str(LIMIT),
            "--variants", f"{run['ref']},{run['other']}", "--no-noise-floor", "--run-id", run_id]
    run_and_kill_at(args, tmp, run_id, run["other"], MID_GENERATION)  # evalpipe alone: its guards stop the worker
    journaled = cut_journal_short(run_dir / run["other"] / JOURNAL_FILE, LIMIT // 3)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # nobody could say otherwise
    done = evalpipe(*args, cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"kept (finished, artifacts verified): {run['ref']}" in done.stdout
    assert f"request journal: {journaled} answers kept from an earlier attempt" in done.stdout, done.stdout[-2000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and len(info["attempts"]) == 1
    reused = json.loads((run_dir / run["other"] / "manifest.json").read_text())["engine"]["journal"]
    assert reused["answers_reused"] == journaled, reused  # what the journal held was not asked again
    for name in (run["ref"], run["other"]):
        for table in ("samples.parquet", "tokens.parquet", "teacher.parquet"):
            a, b = run["dir"] / name / table, run_dir / name / table
            if name == run["ref"]:  # finished before any kill of its own: kept as it was
                assert a.read_bytes() == b.read_bytes(), f"{name}/{table} differs from the uninterrupted run's"
            else:
                differ, of, most = assert_same_but_last_bits(a, b)
                print(f"{name}/{table}: {differ} of {of} logprobs differ, by at most {most:.2g}")
        results = [artifacts.read_json(d / name / "results.json")["results"] for d in (run["dir"], run_dir)]
        assert results[0] == results[1]


@pytest.fixture(scope="module")
def on_cluster(run) -> dict:
    """The module's default A/B again (`--variants` the reference and the other; its A/A run
    comes along), each variant on a node of its own of a three-node Ray cluster."""
    tmp = run["tmp"]
    with local_cluster() as cluster:
        cfg = {"extends": str(tmp / "e2e.yaml"),
               "cluster": {"address": cluster.address, "distinct_nodes": True, "scratch": str(tmp / "scratch")}}
        path = tmp / "on-cluster.yaml"
        path.write_text(yaml.safe_dump(cfg))
        there = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "there-vllm",
                         "--variants", f"{run['ref']},{run['other']}", cwd=tmp)
        left = leftovers(cluster)
        gone = wait_gone("there-vllm", 30)
    return {"proc": there, "dir": tmp / "runs" / "there-vllm", "left": left, "gone": gone}


def test_the_cluster_run_has_the_local_verdicts_and_bytes(run, on_cluster):
    there = on_cluster["proc"]
    assert there.returncode == 0, there.stdout[-3000:] + there.stderr[-3000:]
    remote = json.loads((on_cluster["dir"] / "compare.json").read_text())
    assert [c["variant"] for c in remote["comparisons"]] == [run["other"]]
    assert remote["comparisons"][0]["status"] == comparison(run, run["other"])["status"]
    local_floor = json.loads((run["dir"] / "compare.json").read_text())["noise_floor"]
    assert remote["noise_floor"]["status"] == local_floor["status"]
    info = json.loads((on_cluster["dir"] / "run.json").read_text())
    assert len({p["node_id"] for p in info["placements"].values()}) == 3
    for variant in (run["ref"], f"{run['ref']}-aa", run["other"]):
        verify_variant(artifacts.VariantDir(on_cluster["dir"] / variant))
        for table in (artifacts.SAMPLES_PARQUET, artifacts.TOKENS_PARQUET, artifacts.TEACHER_PARQUET):
            assert sha256_of(on_cluster["dir"] / variant / table) == sha256_of(run["dir"] / variant / table), \
                f"{variant}/{table}"


def test_every_engine_process_on_every_node_reported_its_path(run, on_cluster):
    (remote,) = json.loads((on_cluster["dir"] / "compare.json").read_text())["comparisons"]
    assert remote["paths"]["status"] == "verified", remote["paths"]
    assert remote["paths"]["what_ran"] == comparison(run, run["other"])["paths"]["what_ran"]
    for variant in (run["ref"], f"{run['ref']}-aa", run["other"]):
        probes = json.loads((on_cluster["dir"] / variant / artifacts.PROBES_JSON).read_text())
        assert probes["processes"] and probes["unreadable"] == [], f"{variant}: its processes' probe records did not come back"


def test_nothing_is_left_on_the_cluster(on_cluster):
    assert on_cluster["left"]["actors"] == [] and on_cluster["left"]["groups"] == [], on_cluster["left"]
    assert on_cluster["gone"] == []
