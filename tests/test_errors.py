"""One error model (evalpipe/errors.py): a user error is one sentence and exit 2, a failed
run one sentence and exit 3, and anything else is a bug -- its traceback and exit 3, never
the 2 that would send the user looking for a mistake of theirs. Exit codes are defined once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

import evalpipe
from evalpipe.cli import app
from evalpipe.commands import compare as compare_command
from evalpipe.config.errors import ConfigError
from evalpipe.errors import EvalpipeError, ExitCode, RunFailed, RunFailedOnUserInput, UserError, failure

PACKAGE = Path(evalpipe.__file__).parent


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "run.json").write_text("{}", encoding="utf-8")
    return tmp_path


def _compare_raising(monkeypatch, run_dir, error: BaseException):
    def report_run(*args, **kwargs):
        raise error

    monkeypatch.setattr(compare_command, "report_run", report_run)
    return CliRunner().invoke(app, ["compare", str(run_dir)])


@pytest.mark.parametrize("error", [ValueError("shapes (3,) and (4,) not aligned"), KeyError("verdict"),
                                   TypeError("'NoneType' object is not subscriptable")])
def test_a_bug_exits_3_with_its_traceback(monkeypatch, run_dir, error):
    res = _compare_raising(monkeypatch, run_dir, error)
    assert res.exit_code == ExitCode.FAILED == 3, res.output
    assert "Traceback (most recent call last)" in res.output
    assert f"evalpipe hit a bug ({type(error).__name__}: " in res.output


def test_a_user_error_is_one_sentence_and_exit_2(monkeypatch, run_dir):
    res = _compare_raising(monkeypatch, run_dir, ConfigError("gates.scores.margin must be positive; fix the config."))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.output.strip() == "error: gates.scores.margin must be positive; fix the config."


def test_a_failed_run_is_one_sentence_and_exit_3(monkeypatch, run_dir):
    res = _compare_raising(monkeypatch, run_dir, RunFailed("variant sp failed (engine failed to start)."))
    assert res.exit_code == 3 and "Traceback" not in res.output, res.output
    assert res.output.strip() == "error: variant sp failed (engine failed to start)."


def test_a_run_failed_on_the_users_input_is_theirs_to_fix(monkeypatch, run_dir):
    res = _compare_raising(monkeypatch, run_dir, failure("variant sp failed (unknown task gsm9k).", ExitCode.USER_ERROR))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert isinstance(failure("x", ExitCode.USER_ERROR), RunFailed), "callers that catch a failed run still catch it"
    assert type(failure("x", ExitCode.FAILED)) is RunFailed
    assert isinstance(RunFailedOnUserInput("x"), UserError)


def _classes(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef):
            yield node


def test_every_error_evalpipe_raises_on_purpose_derives_from_one_base():
    """An error class outside the one model would fall through to "a bug" (or, before,
    be caught as a ValueError with numpy's and pyarrow's own)."""
    builtin_bases = {"Exception", "ValueError", "RuntimeError", "KeyError", "TypeError", "OSError", "LookupError"}
    # probes/ runs inside the engine with the standard library only; lab/layout/ is the engine-side lab model
    engine_side = (("probes",), ("lab", "layout"))
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if any(rel.parts[:len(side)] == side for side in engine_side) or rel.name == "errors.py":
            continue
        for cls in _classes(path):
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if bases & builtin_bases and not cls.name.startswith("_"):
                bad.append(f"{rel}:{cls.lineno} {cls.name}({', '.join(sorted(bases))})")
    assert not bad, "derive from evalpipe.errors.UserError or RunFailed: " + "; ".join(bad)
    assert issubclass(ConfigError, UserError) and issubclass(UserError, EvalpipeError)
    assert not issubclass(UserError, ValueError), "the CLI must not mistake a library's ValueError for the user's"


def test_exit_codes_are_numbers_in_one_place():
    """No module spells an exit code as a number of its own (errors.ExitCode holds them)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name == "errors.py" or rel.parts[0] == "probes":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            names += [e.id for t in targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)]
            if any(n.startswith("EXIT") for n in names):
                numbers = [c for c in ast.walk(node.value) if isinstance(c, ast.Constant) and type(c.value) is int]
                if numbers:
                    bad.append(f"{rel}:{node.lineno} {', '.join(names)}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("Exit", "exit"):
                if any(isinstance(a, ast.Constant) and type(a.value) is int and a.value != 0 for a in node.args):
                    bad.append(f"{rel}:{node.lineno} exit with a literal code")
    assert not bad, "use evalpipe.errors.ExitCode: " + "; ".join(bad)


def test_exit_codes_as_git_bisect_run_reads_them():
    from evalpipe.errors import GIT_BISECT_SKIP, GIT_BISECT_STOP, ExitCode, for_git_bisect

    assert for_git_bisect(ExitCode.OK) == 0 and for_git_bisect(ExitCode.DIVERGENT) == 1
    assert for_git_bisect(ExitCode.FAILED) == for_git_bisect(ExitCode.INCONCLUSIVE) == GIT_BISECT_SKIP == 125
    assert for_git_bisect(ExitCode.USER_ERROR) == GIT_BISECT_STOP > 127, "a config error stops the bisect, never blames"
    assert for_git_bisect(ExitCode.INTERRUPTED) > 127
