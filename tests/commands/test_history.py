"""The history, baseline and nightly commands on hand-built nights (no engine): what
they print, and one sentence with exit code 2 for bad input."""

from __future__ import annotations

import pyarrow.parquet as pq
from nightly_fakes import write_night

from tests.test_cli import GOOD, assert_user_error, evalpipe, write


def _nights(tmp_path, n=3, fault_from=None):
    root = tmp_path / "runs"
    for i in range(n):
        fault = fault_from is not None and i >= fault_from
        write_night(root, i, fault=fault, components={"vllm_ascend": "bad2" if fault else "good1"})
    return root


def test_import_list_show_export_and_baseline(tmp_path):
    root = _nights(tmp_path)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    proc = evalpipe("history", "import", *(str(root / f"night-{i:02d}") for i in range(3)), "--history", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "recorded night-02" in proc.stdout
    listed = evalpipe("history", "list", "--history", url, cwd=tmp_path)
    assert listed.returncode == 0 and all(f"night-{i:02d}" in listed.stdout for i in range(3))
    shown = evalpipe("history", "show", "night-01", "--history", url, cwd=tmp_path)
    assert shown.returncode == 0 and "legacy-aa (aa)" in shown.stdout and "vllm_ascend good1" in shown.stdout
    assert shown.stdout.count("ran: not recorded (the run predates path probes)") == 3
    out = tmp_path / "h.parquet"
    exported = evalpipe("history", "export", "--format", "parquet", "-o", str(out), "--history", url, cwd=tmp_path)
    assert exported.returncode == 0 and pq.read_table(out).num_rows == 9
    pinned = evalpipe("baseline", "set", "night-00", "--variant", "sp", "--history", url, cwd=tmp_path)
    assert pinned.returncode == 0 and "baseline for sp: night-00" in pinned.stdout


def test_nightly_from_a_finished_run_exits_1_on_a_regression(tmp_path):
    root = _nights(tmp_path, n=4, fault_from=2)
    cfg = write(tmp_path, GOOD)
    codes = []
    for i in range(4):
        proc = evalpipe("nightly", "-c", str(cfg), "--from-run", str(root / f"night-{i:02d}"),
                        "--dashboard", str(tmp_path / "dash" / "index.html"), cwd=tmp_path)
        assert "Traceback" not in proc.stderr
        codes.append(proc.returncode)
    assert codes == [0, 0, 1, 1], proc.stdout + proc.stderr
    assert "REGRESSION" in proc.stdout and "changed between night-01 and night-02: vllm_ascend good1 → bad2" in " ".join(proc.stdout.split())
    assert (root / "night-03" / "nightly-junit.xml").is_file() and (tmp_path / "dash" / "index.html").is_file()


def test_an_inconclusive_night_exits_4_and_show_lists_what_each_variant_ran(tmp_path):
    root = tmp_path / "runs"
    write_night(root, 0, probes=True)
    write_night(root, 1, probes=True, sp_ran="legacy")  # sp silently ran the legacy path
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    cfg = write(tmp_path, GOOD)
    procs = [evalpipe("nightly", "-c", str(cfg), "--from-run", str(root / f"night-{i:02d}"), "--history", url,
                      "--dashboard", str(tmp_path / "dash" / "index.html"), cwd=tmp_path) for i in range(2)]
    assert [p.returncode for p in procs] == [0, 4], procs[-1].stdout + procs[-1].stderr
    assert "nightly night-01: INCONCLUSIVE" in procs[-1].stdout
    assert "tonight's comparison proves nothing about the paths: variant `sp` never called" in " ".join(procs[-1].stdout.split())
    shown = evalpipe("history", "show", "night-01", "--history", url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = [line.strip() for line in shown.stdout.splitlines()]
    legacy_path = "ran: LayoutForCausalLM; layers 3 LayoutDecoderLayer; per forward: all_gather 3; reduce_scatter 3"
    assert lines[lines.index(next(x for x in lines if x.startswith("legacy (reference)"))) + 1] == legacy_path
    assert lines[lines.index(next(x for x in lines if x.startswith("legacy-aa (aa) IDENTICAL"))) + 1] == legacy_path + "; paths verified"
    assert lines[lines.index(next(x for x in lines if x.startswith("sp (variant) INCONCLUSIVE"))) + 1] == legacy_path + "; paths failed"
    night0 = evalpipe("history", "show", "night-00", "--history", url, cwd=tmp_path).stdout
    assert ("ran: LayoutForCausalLM; layers 3 LayoutDecoderLayer; per forward: all_to_all 3; reduce_scatter 3; paths verified"
            in night0)
    listed = evalpipe("history", "list", "--history", url, cwd=tmp_path)
    row = next(line for line in listed.stdout.splitlines() if "night-01" in line)
    assert row.count("INCONCLUSIVE") == 2  # the run's verdict and the night's status


def test_bad_input_is_one_sentence(tmp_path):
    root = _nights(tmp_path, n=1)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    cfg = write(tmp_path, GOOD)
    assert_user_error(evalpipe("nightly", "-c", str(cfg), "--component", "oops", "--from-run", str(root / "night-00"), cwd=tmp_path),
                      "--component 'oops' is not NAME=VERSION")
    assert_user_error(evalpipe("nightly", "-c", str(cfg), "--from-run", str(tmp_path), cwd=tmp_path), "is not a run directory")
    assert_user_error(evalpipe("history", "list", "--history", "nonsense", cwd=tmp_path), "is not an SQLAlchemy URL")
    assert_user_error(evalpipe("history", "import", str(tmp_path), "--history", url, cwd=tmp_path), "is not a run directory")
    assert_user_error(evalpipe("history", "export", "--format", "xls", "-o", str(tmp_path / "x"), "--history", url, cwd=tmp_path),
                      "export format 'xls' is not one of csv, parquet")
    assert not (tmp_path / "h.sqlite").exists(), "refused before the history was created"
    assert evalpipe("history", "import", str(root / "night-00"), "--history", url, cwd=tmp_path).returncode == 0
    assert_user_error(evalpipe("history", "show", "nope", "--history", url, cwd=tmp_path), "no run 'nope'")
    assert_user_error(evalpipe("baseline", "set", "nope", "--history", url, cwd=tmp_path), "no run 'nope'")
    bad = write(tmp_path, {**GOOD, "nightly": {"min_nights": 0}})
    assert_user_error(evalpipe("nightly", "-c", str(bad), cwd=tmp_path), "nightly.min_nights")
    assert not (tmp_path / "reports").exists()


def one_sentence(proc) -> str:
    """Exit 2, no traceback, one error line; the message, flattened."""
    assert_user_error(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert sum(line.startswith("error:") for line in lines) == 1, proc.stderr
    flat = " ".join(proc.stderr.split())[len("error: "):]
    assert flat.endswith(".") and ". " not in flat, flat
    return flat


def test_reading_a_history_that_is_not_there_creates_nothing(tmp_path):
    """list, show and export only read: a missing SQLite file (in a missing directory) is
    one sentence naming where and what creates a history; no directory, no empty database."""
    missing = tmp_path / "no" / "such" / "dir" / "h.sqlite"
    url = f"sqlite:///{missing}"
    for args in (["history", "list"], ["history", "show", "night-00"], ["history", "export", "-o", str(tmp_path / "x.csv")],
                 ["baseline", "set", "night-00"]):
        flat = one_sentence(evalpipe(*args, "--history", url, cwd=tmp_path))
        assert flat == (f"there is no history at {url} ({missing} does not exist); `evalpipe run`, `evalpipe nightly` and "
                        "`evalpipe history import RUN_DIR...` create it, or pass the --history / --output of an existing one."), flat
    # the default location, history.sqlite under --output
    flat = one_sentence(evalpipe("history", "list", "--output", str(tmp_path / "out"), cwd=tmp_path))
    assert f"{tmp_path / 'out' / 'history.sqlite'} does not exist" in flat
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing created"


def test_reading_commands_leave_an_existing_history_as_it_was(tmp_path):
    root = _nights(tmp_path, n=1)
    db = tmp_path / "h.sqlite"
    url = f"sqlite:///{db}"
    assert evalpipe("history", "import", str(root / "night-00"), "--history", url, cwd=tmp_path).returncode == 0
    before = db.read_bytes()
    db.chmod(0o444)  # read-only: a command that tried to write would fail
    try:
        assert evalpipe("history", "list", "--history", url, cwd=tmp_path).returncode == 0
        assert evalpipe("history", "show", "night-00", "--history", url, cwd=tmp_path).returncode == 0
        exported = evalpipe("history", "export", "-o", str(tmp_path / "x.csv"), "--history", url, cwd=tmp_path)
        assert exported.returncode == 0 and "wrote 3 rows" in exported.stdout, exported.stderr
    finally:
        db.chmod(0o644)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite", "runs", "x.csv"], "no journal or other file left"


def test_a_file_that_is_no_history_is_refused_by_the_readers(tmp_path):
    import sqlite3

    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).close()  # an empty SQLite database: no evalpipe tables
    url = f"sqlite:///{other}"
    flat = one_sentence(evalpipe("history", "list", "--history", url, cwd=tmp_path))
    assert flat.startswith(f"{url} holds no evalpipe history (it has no schema_version table)"), flat
    assert other.stat().st_size == 0, "no table was created"


def test_import_and_export_check_everything_before_writing(tmp_path):
    root = _nights(tmp_path, n=1)
    db = tmp_path / "new" / "h.sqlite"
    url = f"sqlite:///{db}"
    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    # the second directory is not a run: the first is not recorded either, and no database is made
    flat = one_sentence(evalpipe("history", "import", str(root / "night-00"), str(not_a_run), "--history", url, cwd=tmp_path))
    assert flat == f"{not_a_run} is not a run directory (it has no run.json); pass the directory `evalpipe run` wrote."
    flat = one_sentence(evalpipe("history", "import", str(root / "night-00"), "--kind", "nighty", "--history", url, cwd=tmp_path))
    assert flat == "--kind 'nighty' is not one of run, nightly; pass --kind run or --kind nightly."
    flat = one_sentence(evalpipe("history", "export", "--format", "xml", "-o", str(tmp_path / "x.xml"), "--history", url,
                                 cwd=tmp_path))
    assert flat == "export format 'xml' is not one of csv, parquet; pass --format csv or --format parquet."
    assert not (tmp_path / "new").exists() and not (tmp_path / "x.xml").exists()


def test_a_postgresql_url_without_a_server_names_the_url(tmp_path):
    flat = one_sentence(evalpipe("history", "list", "--history", "postgresql://", cwd=tmp_path, env={"PGHOST": None}))
    assert flat == ("history URL 'postgresql://' names no database server and no database; "
                    "write it as postgresql+psycopg://USER@HOST[:PORT]/DATABASE."), flat
    assert "socket" not in flat


def test_a_list_with_nothing_to_show_says_so_even_quietly(tmp_path):
    root = _nights(tmp_path, n=1)
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    assert evalpipe("history", "import", str(root / "night-00"), "--history", url, cwd=tmp_path).returncode == 0
    for progress in ("terminal", "quiet"):
        listed = evalpipe("--progress", progress, "history", "list", "--kind", "run", "--history", url, cwd=tmp_path)
        assert listed.returncode == 0 and listed.stdout.startswith("no runs recorded yet"), (progress, listed.stdout)
