"""Tasks: finding lm-eval tasks by name (index), their families and hub data, RULER's
generated items, and the per-task settings a run config applies (configure).

Both the parent (checks before any engine starts) and the worker (builds the tasks for
lm-eval) import this package; the task YAMLs themselves are in the project's tasks/.
"""
