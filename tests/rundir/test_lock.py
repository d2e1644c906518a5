"""The run-directory lock (evalpipe/rundir/lock.py): one process writes a run directory at a
time, a second is refused in one sentence naming the holder, a killed holder leaves no
stale lock, the lock is re-entrant within a process, and `run`, `compare`, `nightly
--from-run` and `calibrate --from-run` hold it while they write."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rundir_checks import finished_run, one_error_line
from typer.testing import CliRunner

from evalpipe.cli import app
from evalpipe.errors import RunFailed
from evalpipe.reporting import TerminalReporter
from evalpipe.rundir.lock import (
    LOCK_FILE,
    RunDirBusy,
    RunDirReadOnly,
    check_writable,
    holding_run_dir,
    lock_run_dir,
    unlock_run_dir,
)

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
    from nightly_fakes import write_night

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


def test_a_directory_that_cannot_be_written_is_refused_before_it_is_locked(tmp_path):
    """(A missing directory here: root writes through a read-only mode, and the tests may run as root.)"""
    missing = tmp_path / "gone"
    with pytest.raises(RunDirReadOnly) as err:
        lock_run_dir(missing)
    assert str(err.value) == (f"run directory {missing} cannot be written (No such file or directory); make it "
                              "writable, or write elsewhere (another --run-id or --output).")
    with pytest.raises(RunDirReadOnly, match=r"; make it writable\.$"):
        check_writable(missing, elsewhere=None)
    check_writable(tmp_path)
    assert list(tmp_path.iterdir()) == [], "the check leaves no file behind"
