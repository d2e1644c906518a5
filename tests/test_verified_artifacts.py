"""Verified artifacts (evalpipe.rundir.integrity) and the run-directory lock (evalpipe.rundir.lock).

A finished variant's manifest records every artifact's size, sha256 and row count;
compare and the history refuse a variant whose files no longer match, in one sentence
naming the file; variants from before the record are accepted. One process writes a
run directory at a time; a killed holder leaves no stale lock. No engine starts here.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakes import make_samples, mutate, record_artifacts, set_token, write_run
from typer.testing import CliRunner

from evalpipe.cli import app
from evalpipe.documents.manifest import EngineInfo, VariantManifest, write_manifest
from evalpipe.documents.worker_job import JOB_JSON, WorkerJob, write_job
from evalpipe.errors import ExitCode, RunFailed
from evalpipe.history.store import HistoryError, open_history
from evalpipe.pipeline.comparing import compare_across_runs, compare_run
from evalpipe.reporting import TerminalReporter
from evalpipe.rundir import artifacts, integrity
from evalpipe.rundir.artifacts import RunDir, VariantDir
from evalpipe.rundir.integrity import ArtifactMismatch, verify_variant
from evalpipe.rundir.lock import LOCK_FILE, RunDirBusy, holding_run_dir, lock_run_dir, unlock_run_dir


def finished_run(root: Path, *, record: bool = True) -> Path:
    """legacy vs sp (one changed token), both with teacher.parquet; with ``record`` each
    manifest gets the artifacts record the worker's finish step writes."""
    s = make_samples(8)
    run_dir = write_run(root, {"legacy": s, "sp": mutate(s, 2, set_token(3, 7))}, reference="legacy",
                        run_info={"status": "ok"}, teachers={"legacy": s, "sp": s})
    for name in ("legacy", "sp"):
        vdir = RunDir(run_dir).variant(name)
        artifacts.write_json(vdir.results, {"results": {"t": {"acc": 0.5}}})
        if record:
            record_artifacts(vdir)
    return run_dir


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the column data: the footer (rows) still reads
    path.write_bytes(bytes(data))


def one_row_fewer(path: Path) -> None:
    table = artifacts.read_table(path)
    artifacts.write_table(path, table.slice(0, table.num_rows - 1))


def edit_json(path: Path) -> None:
    path.write_text(path.read_text().replace("0.5", "0.6"))  # same size: only the sha256 tells


# (case, file of variant sp, tampering, what the sentence says is wrong)
TAMPERING = [
    ("truncated", "tokens.parquet", truncate, r"it has \d+ bytes, the manifest records \d+: the file was truncated or altered"),
    ("byte-flipped", "samples.parquet", flip_byte, r"sha256 differs: the file was altered after the variant finished"),
    ("deleted", "teacher.parquet", lambda p: p.unlink(), r"the file is missing; the variant finished with it"),
    ("row-removed", "tokens.parquet", one_row_fewer, r"it has 63 rows, the manifest records 64: the table was rewritten"),
    ("json-edited", "results.json", edit_json, r"sha256 differs"),
]


def sentence_for(path: Path, what: str) -> str:
    return rf"^{re.escape(str(path))} does not match its manifest \({what}[^)]*\); re-run the variant or restore the file\.$"


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output, output
    assert len(lines) >= 1 and lines[0].startswith("error: "), output
    return " ".join(" ".join(lines)[len("error: "):].split())  # rich wraps long lines


@pytest.mark.parametrize("case,name,tamper,what", TAMPERING, ids=[t[0] for t in TAMPERING])
def test_compare_and_history_refuse_a_changed_file_naming_it(tmp_path, monkeypatch, case, name, tamper, what):
    run_dir = finished_run(tmp_path / "run")
    path = run_dir / "sp" / name
    tamper(path)
    with pytest.raises(ArtifactMismatch) as err:
        verify_variant(VariantDir(run_dir / "sp"))
    message = str(err.value)
    assert re.match(sentence_for(path, what), message), message
    assert message.count(". ") == 0 and "\n" not in message, "one sentence"
    with pytest.raises(ArtifactMismatch, match=re.escape(message)):
        compare_run(run_dir)
    # `evalpipe compare`: exit 2, the sentence, no traceback, nothing (re)written
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", str(run_dir)])
    assert res.exit_code == 2, res.output
    assert one_error_line(res.stderr or res.output) == message
    assert not (run_dir / "compare.json").exists() and not (run_dir / "report.html").exists()
    # the history refuses to record it, with its own error type and the same sentence
    db = open_history(None, tmp_path / "history")
    with pytest.raises(HistoryError) as herr:
        db.record(run_dir)
    assert str(herr.value) == message
    assert db.runs() == []
    res = CliRunner().invoke(app, ["history", "import", str(run_dir), "--output", str(tmp_path / "history")])
    assert res.exit_code == 2 and one_error_line(res.stderr or res.output) == message


def test_an_untouched_run_passes_everywhere(tmp_path, monkeypatch):
    run_dir = finished_run(tmp_path / "run")
    manifest = artifacts.read_json(run_dir / "sp" / "manifest.json")
    record = manifest["artifacts"]
    assert sorted(record) == ["results.json", "samples.parquet", "teacher.parquet", "tokens.parquet"]
    assert record["samples.parquet"]["rows"] == 8 and record["tokens.parquet"]["rows"] == 64
    assert record["tokens.parquet"]["bytes"] == (run_dir / "sp" / "tokens.parquet").stat().st_size
    assert "rows" not in record["results.json"] and len(record["results.json"]["sha256"]) == 64
    for name in ("legacy", "sp"):
        verify_variant(run_dir / name)
    assert compare_run(run_dir).status.value == "DIVERGENT"
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", str(run_dir)])
    assert res.exit_code == 1, res.output
    assert open_history(None, tmp_path / "history").record(run_dir) == "run"


def test_a_manifest_without_the_record_is_accepted(tmp_path):
    """Run directories from before the record keep working (nothing to check them against)."""
    run_dir = finished_run(tmp_path / "run", record=False)
    truncate(run_dir / "sp" / "results.json")  # unverifiable, and not read by compare
    verify_variant(run_dir / "sp")
    assert compare_run(run_dir).status.value == "DIVERGENT"
    assert open_history(None, tmp_path / "history").record(run_dir) == "run"


def identical_run(root: Path, *, noise_floor: bool = False) -> Path:
    """legacy vs sp with the same outputs (IDENTICAL, every gate passes), both recorded."""
    s = make_samples(8)
    names = ["legacy", "sp", *(["legacy-aa"] if noise_floor else [])]
    run_dir = write_run(root, dict.fromkeys(names, s), reference="legacy", run_info={"status": "ok"},
                        noise_floor="legacy-aa" if noise_floor else None)
    for name in names:
        record_artifacts(RunDir(run_dir).variant(name))
    return run_dir


def missing_sentence(vdir: Path, fix: str) -> str:
    return (f"{vdir / 'manifest.json'} is missing, so nothing shows that the files of variant {vdir.name!r} are what "
            f"it wrote; {fix}.")


UNVERIFIED_FIX = ("restore it or re-run the variant, or compare it unverified with `evalpipe compare --unverified` "
                  "(verdict INCONCLUSIVE)")


def test_a_deleted_manifest_is_refused_not_compared_unverified(tmp_path, monkeypatch):
    """The hole: sp/manifest.json deleted used to be compared unchecked and judged a pass."""
    run_dir = identical_run(tmp_path / "run")
    assert compare_run(run_dir).status.value == "IDENTICAL"
    (run_dir / "sp" / "manifest.json").unlink()
    run_json = (run_dir / "run.json").read_bytes()
    with pytest.raises(integrity.ManifestMissing) as err:
        verify_variant(run_dir / "sp")
    assert str(err.value) == missing_sentence(run_dir / "sp", "restore it or re-run the variant")
    with pytest.raises(integrity.ManifestMissing, match=re.escape(missing_sentence(run_dir / "sp", UNVERIFIED_FIX))):
        compare_run(run_dir)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", str(run_dir)])
    assert res.exit_code == 2, res.output
    assert one_error_line(res.stderr or res.output) == missing_sentence(run_dir / "sp", UNVERIFIED_FIX)
    assert not (run_dir / "compare.json").exists() and (run_dir / "run.json").read_bytes() == run_json
    # the history refuses it too (it has no --unverified), and no database is created for it
    res = CliRunner().invoke(app, ["history", "import", str(run_dir), "--output", str(tmp_path / "history")])
    assert res.exit_code == 2, res.output
    assert one_error_line(res.stderr or res.output) == missing_sentence(run_dir / "sp", "restore it or re-run the variant")
    assert not (tmp_path / "history").exists()
    # and so does teacher forcing from a reference that lost its manifest
    from evalpipe.rundir.sequences import read_reference_sequences

    (run_dir / "legacy" / "manifest.json").unlink()
    with pytest.raises(integrity.ManifestMissing, match="legacy/manifest.json is missing"):
        read_reference_sequences(run_dir / "legacy")


def test_compare_unverified_says_so_everywhere_and_is_no_pass(tmp_path, monkeypatch):
    """--unverified reads it; compare.json, the reports, junit.xml and the terminal name the
    variant, and the verdict is INCONCLUSIVE (exit 4), what the outputs said kept beside it."""
    run_dir = identical_run(tmp_path / "run")
    (run_dir / "sp" / "manifest.json").unlink()
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", str(run_dir), "--unverified"], terminal_width=400)
    assert res.exit_code == 4, res.output
    out = " ".join(res.stdout.split())
    assert out.startswith("run: INCONCLUSIVE Compared unverified (--unverified): sp had no manifest.json, so its files "
                          "were not checked against what the engine wrote; every comparison that read it is INCONCLUSIVE, "
                          "whatever the outputs say."), out
    assert "sp vs legacy: compared unverified (the outputs alone: IDENTICAL)" in out
    assert "all 4 output gates passed (5 skipped), but sp was compared unverified: INCONCLUSIVE" in out
    assert "paths prove nothing" not in out
    doc = artifacts.read_json(run_dir / "compare.json")
    assert doc["status"] == "INCONCLUSIVE" and doc["unverified"] == ["sp"]
    (c,) = doc["comparisons"]
    assert c["status"] == "INCONCLUSIVE" and c["outputs_status"] == "IDENTICAL" and c["unverified"] == ["sp"]
    reason = ("compared unverified (--unverified): 'sp' had no manifest.json, so nothing shows its files are what its "
              "engine wrote")
    assert c["reasons"][0] == reason and c["reasons"][1].startswith("the outputs alone would be IDENTICAL")
    assert all(g["status"] != "fail" for g in c["gates"]), "the gates stay what the outputs say"
    assert artifacts.read_json(run_dir / "run.json")["verdict"] == "INCONCLUSIVE"
    md, html = (run_dir / "report.md").read_text(), (run_dir / "report.html").read_text()
    assert "**Compared unverified (--unverified): sp had no manifest.json" in md and reason in md
    assert "paths prove nothing" not in md and "path probes do not show" not in md
    assert "Compared unverified (--unverified): sp had no manifest.json" in html
    junit = (run_dir / "junit.xml").read_text()
    assert 'classname="sp.artifacts" name="verified"' in junit and 'type="unverified"' in junit
    assert 'failures="1"' in junit
    # a verified comparison's compare.json has no such key
    res = CliRunner().invoke(app, ["compare", str(identical_run(tmp_path / "clean"))])
    assert res.exit_code == 0 and "unverified" not in (tmp_path / "clean" / "compare.json").read_text()


def test_unverified_divergent_reference_and_noise_floor(tmp_path):
    # a DIVERGENT comparison read unverified proves nothing either: INCONCLUSIVE, DIVERGENT kept as what the outputs said
    run_dir = finished_run(tmp_path / "run")
    (run_dir / "sp" / "manifest.json").unlink()
    (c,) = compare_run(run_dir, unverified=True).comparisons
    assert c.status.value == "INCONCLUSIVE" and c.verdict.outputs.value == "DIVERGENT" and c.unverified == ("sp",)
    # an A/A run without its manifest bounds every comparison's gates: all of them are unverified
    run_dir = identical_run(tmp_path / "nf", noise_floor=True)
    (run_dir / "legacy-aa" / "manifest.json").unlink()
    with pytest.raises(integrity.ManifestMissing, match="legacy-aa/manifest.json is missing"):
        compare_run(run_dir)
    rc = compare_run(run_dir, unverified=True)
    assert rc.noise_floor.unverified == ("legacy-aa",) and rc.comparisons[0].unverified == ("legacy-aa",)
    assert rc.status.value == "INCONCLUSIVE" and rc.unverified == ["legacy-aa"]
    # the reference without one: every variant compared with it is unverified
    run_dir = identical_run(tmp_path / "ref")
    (run_dir / "legacy" / "manifest.json").unlink()
    (c,) = compare_run(run_dir, unverified=True).comparisons
    assert c.unverified == ("legacy",) and c.status.value == "INCONCLUSIVE"


def test_compare_across_runs_refuses_a_side_without_its_manifest(tmp_path, monkeypatch):
    a, b = identical_run(tmp_path / "run1"), identical_run(tmp_path / "run2")
    (b / "legacy" / "manifest.json").unlink()
    with pytest.raises(integrity.ManifestMissing):
        compare_across_runs(a / "legacy", b / "legacy")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", str(a / "legacy"), str(b / "legacy")])
    assert res.exit_code == 2 and "is not a variant directory (no manifest.json)" in one_error_line(res.stderr or res.output)
    res = CliRunner().invoke(app, ["compare", str(a / "legacy"), str(b / "legacy"), "--unverified", "--output", "out"])
    assert res.exit_code == 4, res.output
    assert artifacts.read_json(tmp_path / "out" / "compare.json")["unverified"] == ["run2/legacy"]


def test_a_file_added_after_the_variant_finished_is_refused(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    extra = run_dir / "sp" / "teacher_baseline.parquet"
    extra.write_bytes((run_dir / "sp" / "teacher.parquet").read_bytes())
    with pytest.raises(ArtifactMismatch, match=rf"^{re.escape(str(extra))} is not in its manifest \(the variant finished "
                                               r"without it, so it was added afterwards\); move it out of the variant directory or re-run the variant\.$"):
        compare_run(run_dir)
    (run_dir / "sp" / "notes.txt").write_text("not an artifact")  # what no reader reads is not checked
    extra.unlink()
    verify_variant(run_dir / "sp")


def test_a_broken_manifest_is_one_sentence(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    (run_dir / "sp" / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactMismatch, match=r"manifest.json cannot be read \(.*\); restore it or re-run the variant\.$"):
        compare_run(run_dir)
    write_manifest(run_dir / "sp" / "manifest.json", VariantManifest.model_validate(
        {"variant": "sp", "status": "ok", "artifacts": {"../run.json": {"bytes": 1, "sha256": "0" * 64}}}))
    with pytest.raises(ArtifactMismatch, match="which is not a file of the variant"):
        verify_variant(run_dir / "sp")


def test_compare_across_runs_verifies_both_sides(tmp_path):
    a, b = finished_run(tmp_path / "run1"), finished_run(tmp_path / "run2")
    assert compare_across_runs(a / "legacy", b / "legacy").status.value == "IDENTICAL"
    truncate(b / "legacy" / "samples.parquet")
    with pytest.raises(ArtifactMismatch, match=re.escape(str(b / "legacy" / "samples.parquet"))):
        compare_across_runs(a / "legacy", b / "legacy")


class _Engine:
    """Just enough of an engine for a worker with no tasks to reach its finish step."""

    def info(self):
        return EngineInfo(kind="offline")

    def decode_many(self, ids):
        return ["" for _ in ids]

    def close(self):
        pass


def test_the_worker_records_the_artifacts_when_it_finishes(tmp_path, monkeypatch):
    import lm_eval

    from evalpipe.worker import engine_choice, main

    monkeypatch.setattr(engine_choice, "build_engine", lambda *a, **k: _Engine())
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **k: pytest.fail("no task, no evaluation"))
    vdir = VariantDir(tmp_path / "v")
    job = WorkerJob(variant="v", output_dir=str(vdir.root), engine_args={"model": str(tmp_path)}, tasks=[],
                    seed=1, data_dir=str(tmp_path / "data"), topk=1)
    write_job(vdir.root / JOB_JSON, job)  # as evalpipe.execution.launch writes it

    class Events:
        def emit(self, *a, **k):
            pass

        def progress(self, *a):
            pass

    assert main.run(job, Events()) == ExitCode.OK
    manifest = artifacts.read_json(vdir.manifest)
    assert manifest["status"] == "ok" and manifest["timings"]["checksums_s"] >= 0
    assert sorted(manifest["artifacts"]) == ["job.json", "results.json", "samples.parquet", "tokens.parquet"]
    assert manifest["artifacts"]["tokens.parquet"]["rows"] == 0
    assert manifest["artifacts"]["job.json"]["sha256"] == integrity.sha256_of(vdir.root / "job.json")[0]
    verify_variant(vdir)
    write_job(vdir.root / JOB_JSON, job.model_copy(update={"topk": 5}))
    with pytest.raises(ArtifactMismatch, match="job.json does not match its manifest"):
        verify_variant(vdir)


def test_hashing_streams_in_chunks(tmp_path):
    import hashlib

    path = tmp_path / "big.bin"
    data = bytes(range(256)) * (3 * 4096 + 17)  # a little over 3 MiB: several chunks
    path.write_bytes(data)
    assert integrity.sha256_of(path) == (hashlib.sha256(data).hexdigest(), len(data))


# ---------------------------------------------------------------------------
# the run-directory lock
# ---------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from evalpipe.rundir.lock import lock_run_dir
    lock_run_dir(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")
TRY = "import sys\nfrom evalpipe.rundir.lock import lock_run_dir\nlock_run_dir(sys.argv[1])\n"


def another_process_locks(run_dir: Path) -> bool:
    proc = subprocess.run([sys.executable, "-c", TRY, str(run_dir)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 or "RunDirBusy" in proc.stderr, proc.stderr
    return proc.returncode == 0


def test_a_second_process_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path, monkeypatch):
    run_dir = finished_run(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy) as err:
            lock_run_dir(run_dir)
        assert str(err.value) == (f"run directory {run_dir} is being written by evalpipe process {holder.pid}; "
                                  "wait until it has finished, or write elsewhere (another --run-id or --output).")
        # `evalpipe compare` would rewrite run.json and the reports: refused, exit 2, nothing written
        monkeypatch.chdir(tmp_path)
        res = CliRunner().invoke(app, ["compare", str(run_dir)])
        assert res.exit_code == 2 and one_error_line(res.stderr or res.output) == str(err.value).replace(
            "(another --run-id or --output)", "with --output").replace("write elsewhere", "write the reports elsewhere")
        assert not (run_dir / "compare.json").exists()
        # reading it into another directory needs no lock
        res = CliRunner().invoke(app, ["compare", str(run_dir), "--output", str(tmp_path / "elsewhere")])
        assert res.exit_code == 1 and (tmp_path / "elsewhere" / "compare.json").is_file()
    finally:
        holder.kill()  # SIGKILL: no chance to clean up
        holder.wait()
        holder.stdout.close()
    assert (run_dir / LOCK_FILE).is_file(), "the file stays; only the flock went with the process"
    with holding_run_dir(run_dir):
        assert not another_process_locks(run_dir)
    assert another_process_locks(run_dir)


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)  # a run comparing its own directory
    unlock_run_dir(tmp_path)
    assert not another_process_locks(tmp_path), "still held: one hold is left"
    unlock_run_dir(tmp_path)
    unlock_run_dir(tmp_path)  # one too many: nothing happens
    assert another_process_locks(tmp_path)


def test_a_run_holds_its_directory_until_it_returns(tmp_path, monkeypatch):
    from rich.console import Console

    from evalpipe.config.loading import parse_config
    from evalpipe.pipeline import runner
    from evalpipe.pipeline.plan import make_plan

    cfg = parse_config({"model": {"path": "builtin:tiny-gsm"}, "variants": {"a": {}, "b": {}},
                        "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot"}]}})
    plan = make_plan(cfg, "cfg.yaml", "gsm8k", output=str(tmp_path / "runs"), run_id="locked")
    seen = {}

    def model_step(plan, console):  # runs inside _execute, after the directory was created
        seen["other process could lock"] = another_process_locks(plan.run_dir)
        raise RunFailed("stop here")

    monkeypatch.setattr(runner, "preflight", lambda plan, console: 0)
    monkeypatch.setattr(runner, "ensure_model", model_step)
    with pytest.raises(RunFailed):
        runner.execute(plan, TerminalReporter(Console(file=io.StringIO())), record=False)
    assert seen == {"other process could lock": False}
    assert another_process_locks(plan.run_dir), "released when execute() returned"


def test_nightly_and_calibrate_from_a_run_take_its_lock(tmp_path, monkeypatch):
    """`nightly --from-run` and `calibrate --from-run` write into the run they are given
    (nightly.*, compare.json, calibration.json): refused while another process writes it."""
    from tests.nightly_fakes import write_night

    run_dir = write_night(tmp_path / "runs", 0)
    monkeypatch.chdir(tmp_path)
    dash = str(tmp_path / "dash" / "index.html")
    nightly = ["nightly", "--from-run", str(run_dir), "--dashboard", dash, "--history", f"sqlite:///{tmp_path / 'h.sqlite'}"]
    calibrate = ["calibrate", "--from-run", str(run_dir), "--table", str(tmp_path / "calibration.md")]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        busy = f"run directory {run_dir} is being written by evalpipe process {holder.pid}; wait until it has finished."
        for args in (nightly, calibrate):
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 2 and one_error_line(res.stderr or res.output) == busy, res.output
        assert not (run_dir / "nightly.md").exists() and not (run_dir / "calibration.json").exists()
        assert not (tmp_path / "calibration.md").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    res = CliRunner().invoke(app, nightly)
    assert res.exit_code == 0 and (run_dir / "nightly.md").is_file(), res.output
    assert another_process_locks(run_dir), "given back when the command ended"
