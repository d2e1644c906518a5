"""The task index: find lm-eval tasks by name, evalpipe's tasks/ first, then lm-eval's own.

Both sides use it: the parent checks task names before any engine starts (plan, runner,
doctor), the worker resolves them (evalpipe.tasks.configure).
"""

from __future__ import annotations

import difflib
import functools
from typing import Sequence

from evalpipe.errors import UserError
from evalpipe.install import shipped_dir


class TaskNotFound(UserError):
    """A task name that neither the project's tasks/ nor lm-eval knows, with the closest names."""


@functools.lru_cache(maxsize=4)
def _indexed(tasks_dir: str, with_lm_eval: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=tasks_dir, include_defaults=with_lm_eval)


def task_manager(tasks_dir: str | None = None, names: Sequence[str] | None = None):
    """lm-eval's TaskManager over ``tasks_dir`` (built once per process). When every one of
    ``names`` is a single task of ``tasks_dir``, lm-eval's own ~15,000 task files are
    left out of the index: building that costs about 10 s, once in every worker.
    ``tasks_dir`` defaults to the shipped tasks/ (evalpipe.install)."""
    tasks_dir = tasks_dir or str(shipped_dir("tasks"))
    if names:
        from lm_eval.tasks._index import Kind

        own = _indexed(tasks_dir, False)
        if all(n in own.task_index and own.task_index[n].kind is Kind.TASK for n in names):
            return own
    return _indexed(tasks_dir, True)


def check_task_names(names: list[str], tasks_dir: str | None = None) -> None:
    """Raise TaskNotFound naming the first unknown task, with the closest known names."""
    tasks_dir = tasks_dir or str(shipped_dir("tasks"))
    known = set(task_manager(tasks_dir, names).all_tasks)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise TaskNotFound(
                f"unknown task `{name}`: it is neither in {tasks_dir} nor among lm-eval's tasks.{hint}"
            )
