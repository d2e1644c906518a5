"""The history, baseline and nightly commands on hand-built nights (no engine): what
they print, and one sentence with exit code 2 for bad input."""

from __future__ import annotations

import pyarrow.parquet as pq

from tests.nightly_fakes import write_night
from tests.test_cli_errors import GOOD, assert_user_error, evalpipe, write


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
    assert_user_error(evalpipe("history", "show", "nope", "--history", url, cwd=tmp_path), "no run 'nope'")
    assert_user_error(evalpipe("history", "import", str(tmp_path), "--history", url, cwd=tmp_path), "is not a run directory")
    assert_user_error(evalpipe("history", "export", "--format", "xls", "-o", str(tmp_path / "x"), "--history", url, cwd=tmp_path),
                      "export format 'xls' is not one of csv, parquet")
    assert_user_error(evalpipe("baseline", "set", "nope", "--history", url, cwd=tmp_path), "no run 'nope'")
    bad = write(tmp_path, {**GOOD, "nightly": {"min_nights": 0}})
    assert_user_error(evalpipe("nightly", "-c", str(bad), cwd=tmp_path), "nightly.min_nights")
    assert not (tmp_path / "reports").exists()
