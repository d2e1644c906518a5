"""Loads evalpipe's path probes into this interpreter when EVALPIPE_PROBES names a spec.

This directory is put first on PYTHONPATH of a variant's processes only. A probe that
cannot start says so on stderr and leaves the process alone: the run then has no record
from this process, and the verdict says so. Any sitecustomize this file shadows (a
distribution's own) runs afterwards, as it would have without evalpipe.
"""

import os
import sys


def _activate() -> None:
    spec = os.environ.get("EVALPIPE_PROBES")
    if not spec:
        return
    try:
        from evalpipe.probes import runtime

        runtime.activate(spec)
    except Exception as exc:  # noqa: BLE001 - a probe must never stop the engine it watches
        sys.stderr.write(f"evalpipe probes: not active in process {os.getpid()} ({type(exc).__name__}: {exc})\n")


def _chain() -> None:
    """Run the sitecustomize this one hides (the next one on sys.path), if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_activate()
_chain()
