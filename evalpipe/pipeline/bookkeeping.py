"""What run.json and the variants' manifests say as a run goes: opening (or reopening) the run
directory, the environment the workers measured, a stopped or interrupted variant marked
failed (a worker that was stopped could not say so itself)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from evalpipe.config.errors import ConfigError
from evalpipe.documents.manifest import ManifestStatus, read_manifest, write_manifest
from evalpipe.documents.run_doc import RunDocument, RunStatus, read_run_document, write_run_document
from evalpipe.execution import launch
from evalpipe.rundir import artifacts
from evalpipe.rundir.lock import lock_run_dir
from evalpipe.rundir.resume import reopen


def record_environment(info: RunDocument, variant: str, vdir: Path, *, header: bool = False) -> RunDocument:
    """Lift what the worker measured about its environment into run.json: the
    reference's versions and hardware for the header, and every variant's versions
    beside its settings, where a different build shows up as a difference."""
    manifest_path = artifacts.VariantDir(vdir).manifest
    if not manifest_path.is_file():
        return info
    manifest = read_manifest(manifest_path)
    versions = {k: v for k, v in manifest.versions.items() if v is not None}
    hardware = manifest.hardware.model_dump() if manifest.hardware is not None else None
    settings = dict(info.variant_settings)
    settings[variant] = settings[variant].model_copy(update={"versions": versions})
    # the header's are the reference's (``header``), whenever it finishes (on a cluster the others may finish first)
    first = {k: v for k, v in (("versions", versions), ("hardware", hardware)) if header or k not in info.model_fields_set}
    return info.updated(variant_settings=settings, **first)


def open_run_dir(rd: artifacts.RunDir, fresh: RunDocument) -> tuple[RunDocument, list[str]]:
    """A new run directory, or the interrupted run's own one (same --run-id again, or
    --resume): run.json's content and the variants kept from before. The directory's
    lock is held from here until execute() returns."""
    try:
        rd.root.mkdir(parents=True)  # not exist_ok: of two runs started with one --run-id, one creates it
    except FileExistsError:
        if not rd.run_json.is_file():
            raise ConfigError(f"run directory {rd.root} already exists and holds no run; choose another --output or run id.") from None

        lock_run_dir(rd.root)  # a run still being written is refused here, before anything is read
        return reopen(rd.root, fresh)
    except OSError as err:  # what no check beforehand can tell (/proc, a read-only mount, a full disk)
        raise ConfigError(f"cannot create the run directory {rd.root} ({err.strerror or err}); pass another --output.") from None
    lock_run_dir(rd.root)
    return fresh.updated(status="running", started_at=time.time(), variant_status={}, timings={}), []


def close_manifest(vdir: Path, outcome: Any) -> None:
    """A worker that was stopped (watchdog, time limit, its server's death, a signal) could
    not say so in its manifest: it is marked failed here, so no reader takes a variant
    that stopped half-way for a running or finished one."""
    if not outcome.ok:
        mark_stopped(artifacts.VariantDir(vdir), outcome.error)


def mark_stopped(vdir: artifacts.VariantDir, error: str) -> None:
    if not vdir.manifest.is_file():
        return
    manifest = read_manifest(vdir.manifest)
    if manifest.status is ManifestStatus.RUNNING:
        write_manifest(vdir.manifest, manifest.model_copy(update={"status": ManifestStatus.FAILED, "error": error, "finished_at": time.time()}))


def mark_interrupted(run_dir: Path) -> None:
    """run.json of a run stopped by Ctrl-C or SIGTERM says so, with what had finished
    (instead of `running` forever)."""
    info = read_run_document(run_dir)
    if info is None or info.status is not RunStatus.RUNNING:
        return
    finished = [name for name, v in info.variant_status.items() if v.exit_code == 0]
    by = "SIGTERM" if signal.SIGTERM in launch.interrupts else "SIGINT"  # the list of this process, read now
    rd = artifacts.RunDir(run_dir)
    for name in rd.variant_names():  # the variant that was running when the signal came
        mark_stopped(rd.variant(name), f"interrupted by {by}")
    write_run_document(run_dir, info.updated(
        status="interrupted", interrupted_by=by, interrupted_at=time.time(), finished_variants=finished,
        error=f"interrupted by {by}; finished variants: {', '.join(finished) or 'none'}"))
