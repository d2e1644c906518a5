"""evalpipe/commands/compare.py: `evalpipe compare` from stored artifacts, no engine -- one run
directory compared again (a gates file or --margin driving its verdict, the reports written
elsewhere with --output), or one variant of each of two runs (B against A, the verdict's exit
code, compare.json in --output), and every argument it cannot use refused in one sentence
before anything is written (UserError; through the command line: exit 2)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from fakes import make_samples, mutate, set_token, write_run
from in_process import evalpipe
from rich.console import Console

from evalpipe.commands.compare import compare_command
from evalpipe.errors import ExitCode, UserError
from evalpipe.reporting import TerminalReporter
from evalpipe.rundir.artifacts import MANIFEST_JSON
from tests.test_cli import assert_user_error


def test_compare_on_a_non_run_directory(tmp_path):
    assert_user_error(evalpipe("compare", str(tmp_path), cwd=tmp_path), "is not a run directory")


def _fake_run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", {"a": make_samples(4), "b": make_samples(4)})


def test_compare_gates_file_errors_are_one_sentence(tmp_path):
    run = _fake_run(tmp_path)
    assert_user_error(evalpipe("compare", str(run), "--gates", str(tmp_path / "nope.yaml"), cwd=tmp_path), "does not exist")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"gates": {"tokens": {"teacher_kl": {"abs": 1}}}}))
    assert_user_error(evalpipe("compare", str(run), "--gates", str(bad), cwd=tmp_path), "unknown key `tokens.teacher_kl`")
    assert_user_error(evalpipe("compare", str(run), "--margin", "0", cwd=tmp_path), "--margin must be positive")
    assert not (run / "compare.json").exists(), "nothing written on bad input"


def test_compare_gates_file_drives_the_verdict(tmp_path):
    a = make_samples(6)
    b = mutate(a, 2, set_token(3, 7))  # a token outside both top-k lists: a hard divergence
    run = write_run(tmp_path / "run", {"a": a, "b": b})
    default = evalpipe("compare", str(run), cwd=tmp_path)
    assert default.returncode == 1, default.stdout + default.stderr
    assert json.loads((run / "compare.json").read_text())["status"] == "DIVERGENT"
    loose = tmp_path / "loose.yaml"  # the mapping itself, without a `gates:` key
    loose.write_text(yaml.safe_dump({"tokens": {"free_hard_divergences": {"abs": 1}}, "scores": {"margin": 0.5}}))
    proc = evalpipe("compare", str(run), "--gates", str(loose), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((run / "compare.json").read_text())
    assert data["status"] == "EQUIVALENT" and data["gates"]["scores"]["margin"] == 0.5


def _reporter() -> TerminalReporter:
    return TerminalReporter(Console(file=io.StringIO(), width=200))


@pytest.fixture
def two_runs(tmp_path):
    """Two runs of the same items: variant `a` of each; run two's `b` diverges at item 2."""
    a = make_samples(6)
    one = write_run(tmp_path / "one", {"a": a, "b": a})
    two = write_run(tmp_path / "two", {"a": a, "b": mutate(a, 2, set_token(3, 7))})
    return one, two


def test_one_variant_of_each_of_two_runs_is_compared_into_output(tmp_path, two_runs):
    one, two = two_runs
    out = tmp_path / "same"
    assert compare_command([one / "a", two / "a"], _reporter(), output=out) == ExitCode.OK
    assert json.loads((out / "compare.json").read_text())["status"] == "IDENTICAL"
    assert compare_command([one / "b", two / "b"], _reporter(), output=tmp_path / "diff") == ExitCode.DIVERGENT
    assert json.loads((tmp_path / "diff" / "compare.json").read_text())["status"] == "DIVERGENT"
    assert not (one / "compare.json").exists() and not (two / "compare.json").exists(), "the runs' own files untouched"


def test_one_run_compared_again_writes_its_reports_elsewhere_with_output(tmp_path, two_runs):
    _, two = two_runs
    out = tmp_path / "elsewhere"
    assert compare_command([two], _reporter(), output=out) == ExitCode.DIVERGENT
    assert (out / "compare.json").is_file() and not (two / "compare.json").exists()


@pytest.mark.parametrize(("args", "options", "message"), [
    (["one/a", "one/a"], {}, "both arguments name"),
    (["one/a", "two/a"], {"reference": "a"}, "--reference and --variants apply to one run directory"),
    (["one", "two/a"], {}, "is not a variant directory"),
    (["one/a", "two/a", "two/b"], {}, "compare takes RUN_DIR, or exactly two variant directories"),
    (["one"], {"output": "a-file"}, "is a file, not a directory"),
])
def test_arguments_it_cannot_use_are_refused_before_anything_is_written(tmp_path, two_runs, args, options, message):
    (tmp_path / "a-file").write_text("")
    options = {k: tmp_path / v if k == "output" else v for k, v in options.items()}
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(UserError, match=message):
        compare_command([tmp_path / a for a in args], _reporter(), **options)
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_a_variant_without_its_manifest_is_compared_only_unverified_and_then_inconclusive(tmp_path, two_runs):
    one, two = two_runs
    (two / "a" / MANIFEST_JSON).unlink()
    with pytest.raises(UserError, match="is not a variant directory"):
        compare_command([one / "a", two / "a"], _reporter(), output=tmp_path / "out")
    assert compare_command([one / "a", two / "a"], _reporter(), output=tmp_path / "out", unverified=True) == ExitCode.INCONCLUSIVE
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["status"] == "INCONCLUSIVE"
