"""Starting the probes in a process: read the spec, install the hooks, keep the record on disk.

:func:`activate` runs from ``sitecustomize`` at interpreter start. The record is written
when a model has been built, then at most every ``flush_s`` seconds while something
changes (a background thread), and at exit -- also in a multiprocessing child (vLLM's
engine cores and workers), which leaves through ``os._exit`` without running atexit
handlers; so a killed process leaves a record at most that old. A forked child starts a
record of its own.

:func:`collective` is how code without a function to wrap reports a collective (the
reference layout model's virtual ranks); it does nothing when the probes are off.

Standard library only.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any

from evalpipe.probes import SCHEMA_VERSION
from evalpipe.probes.capture import TensorCapture
from evalpipe.probes.engine_hooks import EngineHooks
from evalpipe.probes.patching import PostImportHooks
from evalpipe.probes.record import ProcessRecord

_record: ProcessRecord | None = None
_capture: TensorCapture | None = None
_flush_s = 0.5
_flusher: threading.Thread | None = None
_flusher_pid = 0


def active() -> bool:
    return _record is not None


def read_spec(path: str) -> dict[str, Any]:
    """The spec file at ``path``, or the spec itself when ``path`` is its JSON (a deployment's
    node on another machine gets it on its command line: the file is not there)."""
    if path.lstrip().startswith("{"):
        spec = json.loads(path)
        path = "the inline spec"
    else:
        with open(path, encoding="utf-8") as fh:
            spec = json.load(fh)
    if spec.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: probe spec version {spec.get('schema_version')!r}, this probe reads {SCHEMA_VERSION}")
    return spec


def activate(spec_path: str) -> None:
    global _record, _flush_s, _capture
    if _record is not None:
        return
    spec = read_spec(spec_path)
    _flush_s = float(spec.get("flush_s", 0.5))
    record = ProcessRecord(spec["out_dir"], spec.get("variant", ""))
    _record = record  # before any hook runs: one may fire at once for a module already loaded
    hooks = PostImportHooks()
    for entry in spec.get("absent", []):
        record.absent[entry["name"]] = entry["why"]
    _capture = TensorCapture(spec["capture"]) if spec.get("capture") else None
    EngineHooks(record, hooks, spec.get("functions", []), spec.get("predicates", []), spec.get("config_paths", []),
                _capture).install()
    # the writer thread only in processes that use vLLM, not in every interpreter that inherits the environment
    hooks.when_loaded("vllm", lambda _module: _start_flusher())
    hooks.install()
    atexit.register(flush)
    os.register_at_fork(after_in_child=_forked)


def record() -> ProcessRecord | None:
    return _record


def collective(kind: str, group: str, *tensors: Any) -> None:
    """Count a collective that no wrapped function performs (``kind`` all_gather,
    reduce_scatter, all_to_all, all_reduce ...; ``group`` e.g. ``virtual``)."""
    if _record is not None:
        _record.note(kind, group, tensors)


def capturing() -> bool:
    """Whether this forward pass is one `evalpipe localize` watches (cheap: call it first)."""
    return _capture is not None and _capture.current() is not None


def capture(module: str, layer: int, pieces: Any, layout: str, **how: Any) -> None:
    """Store the watched rows of a module's output as the ranks hold it (see
    :mod:`evalpipe.probes.capture` for the layouts); nothing unless localize watches this pass."""
    if _capture is not None and _capture.current() is not None:
        _capture.capture(module, layer, pieces, layout, **how)


def flush() -> None:
    """Write the record now (the offline worker calls this before it leaves without atexit)."""
    if _record is not None:
        try:
            _record.write()
        except OSError:
            pass  # the run directory is gone (the run was cleaned up): nothing left to report to
        except Exception as err:  # noqa: BLE001 -- the writer thread must outlive one bad write, and say so
            with _record.lock:
                _record.errors.append(f"writing this record failed once: {err!r}"[:500])


def _forked() -> None:
    if _capture is not None:
        _capture.forked()
    if _record is not None:
        _record.reset()
        if _record.vllm_loaded:
            _start_flusher()


def _flush_at_multiprocessing_exit(_record_in_child: object = None) -> None:
    """A finalizer that writes the record when a multiprocessing child ends (it runs those,
    not atexit); a forked child starts without finalizers, so each fork registers it again."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, flush, exitpriority=100)


def _start_flusher() -> None:
    global _flusher, _flusher_pid
    if _flusher is not None and _flusher_pid == os.getpid() and _flusher.is_alive():
        return
    if _flusher is None and _record is not None:  # the first process of its tree to use vLLM
        import multiprocessing.util

        _flush_at_multiprocessing_exit()
        multiprocessing.util.register_after_fork(_record, _flush_at_multiprocessing_exit)

    def loop() -> None:
        while True:
            time.sleep(_flush_s)
            if _record is not None and _record.dirty:
                flush()

    _flusher_pid = os.getpid()
    _flusher = threading.Thread(target=loop, name="evalpipe-probes", daemon=True)
    _flusher.start()
