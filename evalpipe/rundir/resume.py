"""Continuing an interrupted run in its own directory: what it keeps, and when it refuses.

A run stopped by Ctrl-C, SIGTERM, kill -9, a crash or a failed variant is continued by
running the same command again with the same `--run-id` (or `--resume RUN_DIR`). The
variants that had finished are kept as they are, after their artifacts are checked
against their manifests (evalpipe/rundir/integrity.py); a variant that had not finished starts
again in a clean directory except for its request journal (evalpipe/worker/journal.py),
so it asks its engine only what it lacks. The invocation must describe the same
run: the same config, tasks and limits, variants and reference, and model files.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from evalpipe.config.errors import ConfigError
from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.documents.manifest import ManifestStatus, VariantManifest, read_manifest
from evalpipe.documents.run_doc import Attempt, RunDocument, RunStatus, VariantStatus, read_run_document
from evalpipe.errors import UserError
from evalpipe.rundir import artifacts
from evalpipe.rundir.integrity import ArtifactMismatch, verify_variant

# run.json fields that must be the same for a run to be continued, and how to name them.
SAME = (
    ("config", "config"),
    ("tasks", "tasks and --limit"),
    ("variants", "variants (--variants, --noise-floor)"),
    ("reference", "reference"),
)  # the model is the config's model.path; that its files are the same is checked once it is resolved (fingerprint)
# Outputs of a comparison, rewritten when the resumed run ends (a stale one must not
# stand beside a run that has changed since).
COMPARISON_OUTPUTS = (artifacts.COMPARE_JSON, artifacts.REPORT_MD, artifacts.REPORT_HTML, artifacts.JUNIT_XML)


class ResumeRefused(ConfigError):
    """The directory holds another run, a finished one, or damaged artifacts (exit code 2)."""


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def first_difference(old: Any, new: Any, path: str = "") -> str | None:
    """The dotted path of the first place where two JSON values differ (None: equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                return where
            found = first_difference(old[key], new[key], where)
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if old == new else (path or "the whole value")


def _comparable(info: RunDocument, key: str) -> Any:
    value = _plain(info.model_dump(mode="json")[key])
    if key == "config" and isinstance(value, dict):
        value.pop("output", None)  # where the run lives, not what it is (--resume names it directly)
        value.pop("cluster", None)  # where its variants run: a run begun on a cluster may be finished here
    return value


def check_same_run(run_dir: Path, stored: RunDocument, fresh: RunDocument) -> None:
    for key, label in SAME:
        where = first_difference(_comparable(stored, key), _comparable(fresh, key), key)
        if where is not None:
            raise ResumeRefused(
                f"cannot continue {run_dir}: the {label} of this command and of the interrupted run are not the same "
                f"(first difference at `{where}`); run the interrupted command again unchanged, or choose another --run-id."
            )


def reopen(run_dir: Path, fresh: RunDocument) -> tuple[RunDocument, list[str]]:
    """run.json's content for the continued run and the variants it keeps. The caller
    holds the run directory's lock."""
    try:
        stored = read_run_document(run_dir)
    except UserError as err:
        raise ResumeRefused(str(err)) from None
    if stored is None:
        raise ResumeRefused(f"{run_dir} exists and is not a run directory (no run.json); choose another --run-id or --output.")
    if stored.status is RunStatus.OK:
        raise ResumeRefused(
            f"run {run_dir} has already finished (verdict {stored.verdict}); compare it again with "
            f"`evalpipe compare {run_dir}`, or choose another --run-id for a new run."
        )
    check_same_run(run_dir, stored, fresh)
    kept: dict[str, VariantManifest] = {}  # name -> its manifest, read once: what is verified is what the status is taken from
    statuses = stored.variant_status
    for name in fresh.variants:
        vdir = artifacts.VariantDir(run_dir / name)
        manifest = _finished(vdir)
        if manifest is not None:
            try:
                verify_variant(vdir, manifest)
            except ArtifactMismatch as err:
                raise ResumeRefused(str(err)) from None
            kept[name] = manifest
        elif vdir.root.exists():
            _clear_but_journal(vdir.root)
    for name in COMPARISON_OUTPUTS:
        (run_dir / name).unlink(missing_ok=True)
    attempt = Attempt(at=time.time(), kept=list(kept), previous_status=stored.status)
    stored = stored.without("verdict", "error", "failed_variants", "interrupted_by", "interrupted_at", "finished_variants")
    return stored.updated(
        status="running",
        variant_status={n: statuses.get(n) or _status_from_manifest(m) for n, m in kept.items()},
        attempts=[*stored.attempts, attempt],
    ), list(kept)


def _clear_but_journal(vdir: Path) -> None:
    """Half a variant starts again as if new, except for its request journal: the
    answers it had received are not asked for again."""
    for entry in vdir.iterdir():
        if entry.name == JOURNAL_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _finished(vdir: artifacts.VariantDir) -> VariantManifest | None:
    """The manifest of a variant whose worker said it finished, with the record of what it
    wrote (a variant that finished as evalpipe was killed counts, though run.json never
    heard of it); None for any other (one that cannot be read starts again)."""
    if not vdir.manifest.is_file():
        return None
    try:
        manifest = read_manifest(vdir.manifest)
    except UserError:
        return None
    finished = manifest.status is ManifestStatus.OK and bool(manifest.artifacts)
    return manifest if finished else None


def _status_from_manifest(manifest: VariantManifest) -> VariantStatus:
    return VariantStatus(exit_code=0, seconds=manifest.timings.get("total_s"), error=None)
