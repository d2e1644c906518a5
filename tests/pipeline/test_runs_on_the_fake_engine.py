"""`evalpipe run` and `evalpipe nightly` end to end with the fake engine
(evalpipe/worker/fakes/engine.py) in every worker: the runner, its workers' artifacts, the
comparison and report, the watchdog, a killed worker, Ctrl-C, kill -9 / resume and a
nightly's baseline, without starting vLLM. What only the real engine can show (its
logprobs, teacher forcing inside vLLM, the path probes in vLLM's processes, a served
engine's own behaviour, DP/TP) stays in the slow tests/e2e/; serve mode's
lifecycle runs on the fake server (tests/execution/test_serve.py). Where nobody
signals evalpipe itself, it runs in the test's process (tests/support/in_process.py; its workers
are processes all the same); Ctrl-C and kill -9 start `python -m evalpipe`.

One run of six variants serves most of the module:
  ref       the reference
  same      the same fake model               -> IDENTICAL
  diverge   another distribution from the 3rd generated token on -> DIVERGENT
  hung      stops answering after 2 requests  -> stopped by the watchdog
  killed    its worker SIGKILLs itself after its first request -> failed, named by the signal
  broken    its engine fails to start         -> failed in one sentence, details in engine.log
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import in_process
import pyarrow.compute as pc
import pytest
import yaml
from processes import processes_of, wait_gone

from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.history.store import open_history
from evalpipe.rundir import artifacts
from evalpipe.rundir.integrity import verify_variant
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV, FakeEngine

LIMIT = 4
TOPK = 5
STALL = 3
TASK = "gsm8k_synth_4shot"


def fake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, FAKE_ENGINE_ENV: "1", **extra}


def write_config(tmp: Path, name: str, variants: dict, reference: str) -> Path:
    cfg = {
        "model": {"path": "builtin:tiny-gsm"},
        "engine": {"max_model_len": 4096, "seed": 0},
        "output": str(tmp / "runs"),
        "noise_floor": False,
        # the fake's tokens are bytes: a GSM8K prompt is some 1000 of them, where a real
        # tokenizer's (and so teacher forcing's continuation-only capture) stops short of 1024
        "capture": {"topk": TOPK, "teacher_forcing": True, "prompt_positions": {"min_prompt_tokens": 1 << 16}},
        "reference": reference,
        "variants": variants,
        "tasks": {"gsm8k": [{"task": TASK, "num_fewshot": 4}]},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def evalpipe(*args: str, cwd: Path, behaviour: str = "1") -> subprocess.CompletedProcess:
    """A run whose parent process nobody signals, in-process (tests/support/in_process.py): its
    workers and their guards are processes all the same. Ctrl-C and kill -9 start one."""
    return in_process.evalpipe(*args, cwd=cwd, env={FAKE_ENGINE_ENV: behaviour})


def comparison(run_dir: Path, name: str) -> dict:
    data = json.loads((run_dir / "compare.json").read_text())
    return next(c for c in data["comparisons"] if c["variant"] == name)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fake")
    path = write_config(tmp, "five", reference="ref", variants={
        "ref": {},
        # the same code on both sides: an A/A pair by declaration (else IDENTICAL outputs prove nothing)
        "same": {"expect": {"same_path": True}},
        "diverge": {"env": {FAKE_ENGINE_ENV: "diverge=3"}},
        "hung": {"env": {FAKE_ENGINE_ENV: "hang_after=2"}, "launch": {"stall_timeout_s": STALL}},
        "killed": {"env": {FAKE_ENGINE_ENV: "exit_after=1,signal=KILL"}},
        "broken": {"env": {FAKE_ENGINE_ENV: "fail_start"}},
    })
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "five", cwd=tmp)
    return {"proc": proc, "dir": tmp / "runs" / "five", "tmp": tmp}


FINISHED = ["ref", "same", "diverge"]


def test_the_finished_variants_are_compared_and_the_failed_ones_named(run):
    proc, run_dir = run["proc"], run["dir"]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    err = " ".join(proc.stderr.split())
    assert "variants broken, hung, killed failed" in err and "the other variants were compared: DIVERGENT" in err
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_variants"] == ["broken", "hung", "killed"]
    assert info["verdict"] == "DIVERGENT"
    for name in [*FINISHED, "hung", "killed", "broken"]:
        assert f"variant {name}" in proc.stdout
    assert f"ref · {TASK} · generate: {LIMIT}/{LIMIT}" in proc.stdout, "progress was visible"
    assert wait_gone("five", 5) == []


def test_every_finished_variant_has_all_artifacts(run):
    for name in FINISHED:
        vdir = artifacts.VariantDir(run["dir"] / name)
        for path in (vdir.manifest, vdir.results, vdir.samples, vdir.tokens, vdir.teacher, vdir.engine_log):
            assert path.is_file() and path.stat().st_size > 0, path
        manifest = artifacts.read_json(vdir.manifest)
        assert manifest["status"] == "ok" and manifest["engine"]["kind"] == "fake"
        assert manifest["timings"]["teacher_s"] > 0 and manifest["truncated_prompts"] == 0
        assert manifest["data_files"][TASK]["test"]["sha256"]
        assert {"job.json", "results.json", "samples.parquet", "tokens.parquet", "teacher.parquet"} <= set(manifest["artifacts"])
        assert manifest["artifacts"]["samples.parquet"]["rows"] == LIMIT
        verify_variant(vdir)
        results = artifacts.read_json(vdir.results)
        assert 0.0 <= results["results"][TASK]["exact_match,strict-match"] <= 1.0
        assert results["n-samples"][TASK]["effective"] == LIMIT
    for name in ("compare.json", "report.md", "report.html", "junit.xml"):
        assert (run["dir"] / name).is_file(), name


def test_tokens_line_up_with_samples(run):
    decode = FakeEngine.decode.__get__(object.__new__(FakeEngine))  # the fake's tokenizer needs no state
    vdir = artifacts.VariantDir(run["dir"] / "ref")
    samples = artifacts.read_table(vdir.samples).to_pylist()
    tokens = artifacts.read_table(vdir.tokens)
    assert len(samples) == LIMIT and tokens.num_rows == sum(s["n_tokens"] for s in samples)
    for s in samples:
        mine = tokens.filter(pc.equal(tokens["doc_id"], s["doc_id"])).to_pydict()
        assert mine["pos"] == list(range(s["n_tokens"])) and s["n_tokens"] > 0
        assert decode(mine["token_id"]).startswith(s["response"])
        for tid, lp, top_ids, top_lps in zip(mine["token_id"], mine["logprob"], mine["topk_ids"], mine["topk_logprobs"]):
            assert len(top_ids) == TOPK and top_lps == sorted(top_lps, reverse=True)
            assert tid == top_ids[0] and lp == top_lps[0], "greedy decoding picks the top-1 token"


def test_teacher_forcing_scores_the_references_exact_continuations(run):
    key = [("doc_id", "ascending"), ("pos", "ascending")]
    ref_tokens = artifacts.read_table(artifacts.VariantDir(run["dir"] / "ref").tokens).sort_by(key)
    for name in FINISHED:
        teacher = artifacts.read_table(artifacts.VariantDir(run["dir"] / name).teacher).sort_by(key)
        assert teacher.num_rows == ref_tokens.num_rows
        assert teacher["token_id"].to_pylist() == ref_tokens["token_id"].to_pylist(), "forced tokens are the reference's"
        assert all(len(t) == TOPK for t in teacher["topk_ids"].to_pylist())
        assert teacher["token_text"].null_count == 0
    # a position shifted by one between decoding and scoring would change every logprob
    own = artifacts.read_table(artifacts.VariantDir(run["dir"] / "ref").teacher).sort_by(key)
    assert own["logprob"].to_pylist() == ref_tokens["logprob"].to_pylist()


def test_the_same_model_is_identical_and_a_diverging_one_divergent_where_it_diverges(run):
    same = comparison(run["dir"], "same")
    assert same["status"] == "IDENTICAL", same["reasons"]
    diverge = comparison(run["dir"], "diverge")
    assert diverge["status"] == "DIVERGENT", diverge["reasons"]
    failed = {g["gate"] for g in diverge["gates"] if g["status"] == "fail"}
    assert {"free_hard_divergences", "teacher_kl_p99", "teacher_hard_top1_flips"} <= failed
    assert "first at doc 0 repeat 0 pos 3" in next(g["detail"] for g in diverge["gates"] if g["gate"] == "free_hard_divergences")
    suites = ET.parse(run["dir"] / "junit.xml").getroot()
    (suite,) = [s for s in suites if s.get("name").endswith("-vs-diverge")]
    assert int(suite.get("failures")) == len([g for g in diverge["gates"] if g["status"] == "fail"])


def test_the_watchdog_stops_a_hung_engine_with_its_last_progress_and_log(run):
    run_dir = run["dir"]
    status = json.loads((run_dir / "run.json").read_text())["variant_status"]["hung"]
    error = status["error"]
    assert status["stalled"] and status["exit_code"] == 3, status
    assert error.startswith(f"variant `hung` made no progress for {STALL}s (the stall limit; its last progress: "), error
    # (the engine's words, when it got to say any before the limit: "fake engine: hanging after 2 requests")
    assert f"last lines of {run_dir / 'hung' / 'engine.log'}" in error, error
    assert status["seconds"] < 60, status
    manifest = json.loads((run_dir / "hung" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "made no progress" in manifest["error"]


def test_a_worker_killed_without_a_word_is_named_by_its_signal(run):
    status = json.loads((run["dir"] / "run.json").read_text())["variant_status"]["killed"]
    assert status["exit_code"] == 128 + 9 and not status.get("stalled")
    assert status["error"].startswith("the worker of variant `killed` was killed by SIGKILL"), status
    assert "fake engine: ending the process after 1 requests" in status["error"], "the log's tail belongs in the error"
    manifest = json.loads((run["dir"] / "killed" / "manifest.json").read_text())
    assert manifest["status"] == "failed"


def test_the_run_is_recorded_in_the_history(run):
    hist = open_history(None, run["tmp"] / "runs")
    rec = hist.run("five")
    assert rec.kind == "run" and rec.verdict == "DIVERGENT" and rec.model_fingerprint
    variants = {v.name: v for v in hist.variants_of("five")}
    assert set(FINISHED) <= set(variants) and variants["diverge"].status == "DIVERGENT"
    rows = [r for r in hist.score_rows(["five"], with_items=True) if r.variant == "ref"]
    assert rows and all(r.n == LIMIT and len(r.items) == LIMIT for r in rows)


def test_engine_failure_fails_its_variant_in_one_sentence_and_keeps_the_record(run):
    proc, run_dir = run["proc"], run["dir"]
    flat = " ".join(proc.stderr.split())
    assert "engine failed to start" in flat and "fail_start" in flat and "engine.log" in flat
    status = json.loads((run_dir / "run.json").read_text())["variant_status"]["broken"]
    assert status["exit_code"] == 3 and status["error"].startswith("engine failed to start: RuntimeError: "), status
    assert "Traceback" in (run_dir / "broken" / "engine.log").read_text(), "the details are kept in engine.log"
    manifest = artifacts.read_json(run_dir / "broken" / "manifest.json")
    assert manifest["status"] == "failed" and "fail_start" in manifest["error"]
    assert not (run_dir / "broken" / "samples.parquet").exists()


# ---------------------------------------------------------------- Ctrl-C

def start(args: list[str], cwd: Path, stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evalpipe", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=stderr, text=True, start_new_session=True, env=fake_env())


def test_ctrl_c_ends_the_run_with_130_and_marks_what_was_running(tmp_path):
    run_id = "ctrl-c"
    path = write_config(tmp_path, "slow", reference="a", variants={
        "a": {"env": {FAKE_ENGINE_ENV: "delay=0.5"}}, "b": {"expect": {"same_path": True}}})
    with open(tmp_path / "err", "w+") as err:
        proc = start(["run", "gsm8k", "-c", str(path), "--limit", "8", "--run-id", run_id], tmp_path, err)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if f"a · {TASK} · generate:" in line:
                    break
            else:
                err.seek(0)
                raise AssertionError(f"the run ended before variant a generated: {proc.wait()} {err.read()[-2000:]}")
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
            assert proc.wait(timeout=60) == 130
            assert wait_gone(run_id, 10) == [], "processes of the run survived the interrupt"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    run_dir = tmp_path / "runs" / run_id
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and info["interrupted_by"] == "SIGINT" and info["finished_variants"] == []
    manifest = json.loads((run_dir / "a" / "manifest.json").read_text())
    # the variant the signal stopped says so, as a stopped one does (no reader takes it for a running one)
    assert manifest["status"] == "failed" and manifest["error"] == "interrupted by SIGINT" and "artifacts" not in manifest
    assert not (run_dir / "b").exists() or not (run_dir / "b" / "samples.parquet").exists()


# ---------------------------------------------------------------- kill -9 and resume

RESUME_LIMIT = 6
MID_GENERATION = "the second variant generating"
KILL_POINTS = [
    # (what is happening, the variant whose line it is (None: any), a regex for the line that marks it, kept at the next start)
    ("run directory written, model not yet resolved", None, "run resumed -> ", []),
    ("the reference's engine starting", "legacy", "starting engine", []),
    # (at least 3 answers in its journal: progress is counted after the answer is written)
    (MID_GENERATION, "sp", rf"· {TASK} · generate: [3-6]/", ["legacy"]),
    ("the second variant teacher-forcing", "sp", "teacher forcing: scoring", ["legacy"]),
    ("the comparison (both variants done)", "sp", "done in", ["legacy", "sp"]),
]


def run_and_kill_at(args: list[str], cwd: Path, run_id: str, variant: str | None, marker: str,
                    whole_tree: bool = False) -> str:
    """Start `evalpipe run`, SIGKILL it when a line of ``variant``'s output matches
    ``marker`` (with ``whole_tree``, every process of the run at once, as the OOM killer
    of a job's cgroup or a lost node would; else evalpipe alone, and the guards stop its
    workers), wait until every process of the run is gone and return what it printed."""
    with open(cwd / f"{run_id}.stderr", "w+") as err:
        proc = start(args, cwd, err)
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
        assert proc.returncode == -signal.SIGKILL, \
            f"the run ended before `{marker}` of {variant}:\n{''.join(seen)[-3000:]}{err.read()[-3000:]}"
    assert wait_gone(run_id, 30) == [], "processes outlived evalpipe's SIGKILL"
    return "".join(seen)


def cut_journal_short(path: Path, keep: int) -> int:
    """Leave ``path`` as a kill earlier in the task would have: its first ``keep`` answers
    and half of the next line. Returns the answers kept."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) > keep, f"only {len(lines)} answers in the journal when the kill came"
    path.write_text("".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2], encoding="utf-8")
    return keep


def resume_config(tmp_path: Path) -> list[str]:
    # sp answers slowly enough for every kill point to be reached while it runs; it is the
    # reference's model, so the reference's artifacts are what sp's must come to
    path = write_config(tmp_path, "resume", reference="legacy", variants={
        "legacy": {}, "sp": {"env": {FAKE_ENGINE_ENV: "delay=0.2"}, "expect": {"same_path": True}}})
    return ["run", "gsm8k", "-c", str(path), "--limit", str(RESUME_LIMIT)]


def assert_resumed_to_the_uninterrupted_artifacts(run_dir: Path, done: subprocess.CompletedProcess, attempts: int) -> None:
    """The finished run's artifacts are those of a run never interrupted, byte for byte
    (the fake engine computes the same answers in any order and process; sp's model is
    legacy's); results.json may differ in its timing fields only."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and len(info["attempts"]) == attempts  # every start after the first
    reused = json.loads((run_dir / "sp" / "manifest.json").read_text())["engine"]["journal"]
    assert reused["answers_reused"] >= RESUME_LIMIT // 3, reused
    for table in ("samples.parquet", "tokens.parquet", "teacher.parquet"):
        a, b = run_dir / "legacy" / table, run_dir / "sp" / table
        assert a.read_bytes() == b.read_bytes(), f"sp/{table} differs from the uninterrupted legacy's"
    results = [artifacts.read_json(run_dir / name / "results.json")["results"] for name in ("legacy", "sp")]
    assert results[0] == results[1]


def test_a_run_killed_mid_generation_resumes_from_the_journal(tmp_path):
    """The whole process tree SIGKILLed while the second variant generates (the OOM killer
    of a job's cgroup): the same command keeps the finished variant and answers the other's
    requests its journal holds without asking the engine again."""
    base, run_id = resume_config(tmp_path), "resumed-once"
    run_dir = tmp_path / "runs" / run_id
    _what, variant, marker, _kept = next(k for k in KILL_POINTS if k[0] == MID_GENERATION)
    run_and_kill_at([*base, "--run-id", run_id], tmp_path, run_id, variant, marker, whole_tree=True)
    journaled = cut_journal_short(run_dir / "sp" / JOURNAL_FILE, RESUME_LIMIT // 3)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    done = evalpipe(*base, "--run-id", run_id, cwd=tmp_path)
    assert "kept (finished, artifacts verified): legacy" in done.stdout, done.stdout[-2000:]
    assert f"request journal: {journaled} answers kept from an earlier attempt" in done.stdout, done.stdout[-2000:]
    assert_resumed_to_the_uninterrupted_artifacts(run_dir, done, attempts=1)


@pytest.mark.slow  # six starts of evalpipe, some 10 workers: a minute; the kill mid-generation above is the fast one
def test_a_run_killed_again_and_again_resumes_to_the_uninterrupted_artifacts(tmp_path):
    """kill -9 at five points of a two-variant run (evalpipe alone, or its whole process
    tree at once), each time continued with the same command (or --resume): the finished
    variants are kept, the unfinished one continues from its request journal, and the end
    result is the uninterrupted run's."""
    base, run_id = resume_config(tmp_path), "resumed"
    run_dir = tmp_path / "runs" / run_id
    args = [*base, "--run-id", run_id]
    journaled = 0
    for i, (what, variant, marker, _kept) in enumerate(KILL_POINTS):
        again = args if i % 2 == 0 else [*base, "--resume", str(run_dir)]  # both ways of continuing
        out = run_and_kill_at(again, tmp_path, run_id, variant, marker, whole_tree=i % 2 == 1)
        if i > 0:
            expected = KILL_POINTS[i - 1][3]
            said = f"kept (finished, artifacts verified): {', '.join(expected)}" if expected else "no variant had finished"
            assert said in out, f"restart {i} (after a kill during {KILL_POINTS[i - 1][0]}):\n{out[-2000:]}"
            if KILL_POINTS[i - 1][0] == MID_GENERATION:
                assert f"request journal: {journaled} answers kept from an earlier attempt" in out, out[-2000:]
        if what == MID_GENERATION:
            journaled = cut_journal_short(run_dir / "sp" / JOURNAL_FILE, RESUME_LIMIT // 3)
        assert json.loads((run_dir / "run.json").read_text())["status"] == "running", what  # nobody could say otherwise
    done = evalpipe(*args, cwd=tmp_path)
    assert "kept (finished, artifacts verified): legacy, sp" in done.stdout
    assert_resumed_to_the_uninterrupted_artifacts(run_dir, done, attempts=len(KILL_POINTS))


def test_a_run_of_the_reference_alone_compared_nothing_and_does_not_pass(tmp_path):
    path = write_config(tmp_path, "alone", reference="ref", variants={"ref": {}, "other": {}})
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--variants", "ref", "--limit", "2", "--run-id", "alone", cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())
    assert "INCONCLUSIVE only the reference `ref` ran: nothing was compared, so nothing is proven;" in said, said
    info = json.loads((tmp_path / "runs" / "alone" / "run.json").read_text())
    assert info["status"] == "ok" and info.get("verdict") is None


# ---------------------------------------------------------------- nightly

def test_nightly_passes_its_first_night_and_flags_a_drift_from_the_baseline_night(tmp_path):
    """`evalpipe nightly`'s own branches on two nights of one variant: the first has no
    baseline and compares nothing, so it is INCONCLUSIVE (exit 4), never a pass, yet the
    baseline of the next; the second, whose engine draws other tokens from the 3rd on,
    teacher-forces the baseline night's sequences too and is a REGRESSION (exit 1)."""
    path = write_config(tmp_path, "nightly", reference="ref", variants={"ref": {}})
    cfg = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**cfg, "nightly": {"tasks": "gsm8k"}}))
    history = f"sqlite:///{tmp_path / 'history.sqlite'}"
    dashboard = tmp_path / "dashboard" / "index.html"

    def night(run_id: str, component: str, behaviour: str) -> subprocess.CompletedProcess:
        return evalpipe("nightly", "-c", str(path), "--limit", "3", "--history", history, "--dashboard", str(dashboard),
                        "--component", f"vllm_ascend={component}", "--run-id", run_id, cwd=tmp_path, behaviour=behaviour)

    first = night("night-1", "good", "1")
    assert first.returncode == 4, first.stdout[-3000:] + first.stderr[-3000:]
    assert "nightly night-1: INCONCLUSIVE (no baseline yet)" in first.stdout
    assert "tonight compared nothing: the variant selection leaves no variant to compare with the reference `ref`" in (
        " ".join(first.stdout.split()))
    assert json.loads((tmp_path / "runs" / "night-1" / "nightly.json").read_text())["compared"] is False
    assert not (tmp_path / "runs" / "night-1" / "ref" / "teacher_baseline.parquet").exists()
    second = night("night-2", "bad", "diverge=3")
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert "nightly night-2: REGRESSION (baseline night-1)" in second.stdout
    run_dir = tmp_path / "runs" / "night-2"
    verdict = json.loads((run_dir / "nightly.json").read_text())
    assert verdict["status"] == "REGRESSION" and verdict["baseline"] == "night-1"
    (ref,) = verdict["vs_baseline"]
    assert ref["variant"] == "ref" and ref["status"] == "DIVERGENT" and ref["teacher_forced"], ref
    assert (run_dir / "ref" / "teacher_baseline.parquet").is_file()
    suite = ET.parse(run_dir / "nightly-junit.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures") or 0) >= 1
    hist = open_history(history, tmp_path)
    assert [n.run_id for n in hist.runs(kind="nightly")] == ["night-1", "night-2"]
    assert hist.variants_of("night-2")[0].components["vllm_ascend"] == "bad"
    assert "night-2" in dashboard.read_text()


def test_localize_reruns_the_configurations_and_says_when_an_engine_captured_nothing(run):
    """`evalpipe localize` re-plans the run's reference and variant from run.json and starts
    a localize job for each; the fake engine has no model whose layers could capture, which
    is one sentence naming the configuration, not a comparison of nothing."""
    proc = evalpipe("localize", str(run["dir"]), "--variant", "diverge", "--samples", "2", cwd=run["tmp"])
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 3, out
    assert "localize diverge against ref: 2 sequences" in out
    assert "localize: configuration ref captured nothing" in out and "Traceback" not in out
    job = json.loads((run["dir"] / "localize" / "ref" / "job.json").read_text())
    assert job["tasks"] == [] and len(job["localize"]["sequences"]) == 2
    assert job["engine_args"]["enable_prefix_caching"] is False
    assert not (run["dir"] / "localize.json").exists()


def test_localize_auto_follows_a_divergent_run_and_a_failure_costs_a_warning(tmp_path):
    path = write_config(tmp_path, "auto", reference="ref", variants={"ref": {}, "diverge": {"env": {FAKE_ENGINE_ENV: "diverge=3"}}})
    cfg = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**cfg, "localize": "auto"}))
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", "2", "--run-id", "auto", cwd=tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, out  # the verdict's code: DIVERGENT
    assert "localize diverge against ref" in out and "warning: localize (diverge) failed" in out
    assert (tmp_path / "runs" / "auto" / "compare.json").is_file()


def test_localize_refuses_endpoint_mode_in_one_sentence(run, tmp_path):
    """An endpoint's engine is not evalpipe's to start: no capture point can reach it."""
    info = json.loads((run["dir"] / "run.json").read_text())
    info["config"]["launch"] = {"mode": "endpoint", "url": "http://127.0.0.1:9/v1"}
    where = tmp_path / "endpoint-run"
    where.mkdir()
    (where / "run.json").write_text(json.dumps(info))
    proc = evalpipe("localize", str(where), "--variant", "diverge", cwd=tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out
    assert "localize cannot capture inside ref, diverge: in endpoint mode evalpipe does not start the server" in out
    assert not (where / "localize").exists() and "Traceback" not in out
