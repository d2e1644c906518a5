"""evalpipe's error model and exit codes, defined once.

Two kinds of failure end a command on purpose, each in one sentence and with its own
exit code: :class:`UserError` (something the user fixes: config, arguments, data, a
refused resume; exit 2) and :class:`RunFailed` (the work itself failed: an engine, a
worker, a comparison that could not be made; exit 3). Every other exception is a bug in
evalpipe: the command line prints its traceback and exits 3, never 2, so a numpy or
pyarrow error is not mistaken for bad input.

Standard library only: the worker, inside a variant's interpreter, uses the same codes.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a command's exit status means, for every command (`nightly` and `doctor` too)."""

    OK = 0  # IDENTICAL or EQUIVALENT with each variant's path verified; nightly PASS; doctor all passed
    DIVERGENT = 1  # nightly: REGRESSION
    USER_ERROR = 2
    FAILED = 3  # a run or engine failed, or evalpipe hit a bug (with a traceback)
    INCONCLUSIVE = 4  # nothing proven about the code paths
    INTERRUPTED = 130  # Ctrl-C
    TERMINATED = 143  # SIGTERM


# `git bisect run` reads 0 as good, 1-127 but 125 as bad, 125 as "cannot test this commit"
# and anything above 127 as "stop the bisect": a run that failed or proved nothing is a
# skip, never a bad commit, and a usage or config error (the same at every commit) stops it.
GIT_BISECT_SKIP, GIT_BISECT_STOP = 125, 128


def for_git_bisect(code: int) -> int:
    """evalpipe's exit code as `git bisect run` reads it (`--git-bisect`)."""
    if code in (ExitCode.OK, ExitCode.DIVERGENT, ExitCode.INTERRUPTED, ExitCode.TERMINATED):
        return code  # an interrupt (above 127) stops the bisect too
    if code == ExitCode.USER_ERROR:
        return GIT_BISECT_STOP
    return GIT_BISECT_SKIP


class EvalpipeError(Exception):
    """An error evalpipe raises on purpose; its message is one sentence for the user."""

    exit_code: int = ExitCode.FAILED


class UserError(EvalpipeError):
    """Something the user fixes: what is wrong, where, and how to fix it (exit 2)."""

    exit_code = ExitCode.USER_ERROR


class RunFailed(EvalpipeError):
    """The work failed although the input was fine (an engine, a worker, a comparison): exit 3."""

    exit_code = ExitCode.FAILED


class RunFailedOnUserInput(UserError, RunFailed):
    """A run that failed because of what the user gave it (a worker found a task name or a
    data file wrong, the shipped model files were altered): a failed run, exit 2."""


def failure(message: str, exit_code: int) -> RunFailed:
    """The error for a failure reported as an exit code (a worker's)."""
    return RunFailedOnUserInput(message) if exit_code == ExitCode.USER_ERROR else RunFailed(message)
