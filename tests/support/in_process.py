"""`evalpipe ARGS` in the test's own process, answered as a finished subprocess would be.

A new interpreter costs every command its imports again (pandas, pyarrow, lm-eval's
task index: seconds), where most tests only read a command's exit code and output. Typer's
runner invokes the same command group ``python -m evalpipe`` does (its errors become exit
codes in the group, ``evalpipe.cli._OneErrorModel``), with the streams captured and the
environment set for the call. What it leaves out is ``evalpipe.cli.main``'s signal
handling: tests of interrupts and of whole process trees start a real process.
"""

from __future__ import annotations

import os
import subprocess
import traceback
from pathlib import Path
from typing import Mapping

from typer.testing import CliRunner

from evalpipe.cli import app


def evalpipe(*args: str, cwd: Path, env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """Run the command in ``cwd`` (relative paths and default outputs resolve there) with
    ``env`` over the current environment, and return its code, stdout and stderr."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, list(args), env=env)
    finally:
        os.chdir(before)
    stderr = res.stderr
    code = res.exit_code
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        # an exception past the error model: a process would print its traceback and exit 1
        stderr += "".join(traceback.format_exception(res.exception))
        code = 1
    return subprocess.CompletedProcess(["evalpipe", *args], code, res.stdout, stderr)
