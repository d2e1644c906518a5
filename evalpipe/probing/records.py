"""The parent's side of the path probes: each variant's spec and environment before it
starts, its processes' records gathered into ``<variant>/probes.json`` after it ends.

Every process of a variant (the offline worker, a server's API process, each engine
core and worker) writes ``<variant>/probes/<pid>.json`` (:mod:`evalpipe.probes.record`).
Once the variant is over (its server stopped, or, for a server an A/A run reuses, after
the records' flush interval), :func:`gather` reads them through the typed model
(:class:`evalpipe.compare.code_paths.VariantProbes`), writes probes.json, adds it to the
manifest's verified artifacts and puts a summary in the manifest. A record that cannot be
read is named in probes.json, never skipped silently.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalpipe.compare.code_paths import ProcessProbe, VariantProbes, summarize
from evalpipe.documents.manifest import ArtifactEntry, read_manifest, write_manifest
from evalpipe.errors import UserError
from evalpipe.probes import SCHEMA_VERSION, SITE_DIR, SPEC_ENV, SPEC_FILE
from evalpipe.probing.names import VariantNames
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import PROBES_JSON
from evalpipe.rundir.integrity import describe_file
from evalpipe.validation import first_problem

PROBES_DIR = "probes"  # <variant>/probes/<pid>.json, the per-process records
FLUSH_S = 0.5  # how stale a live process's record may be


def records_dir(vdir: Path) -> Path:
    return vdir / PROBES_DIR


def write_spec(vdir: Path, variant: str, names: VariantNames, capture: dict[str, Any] | None = None) -> Path:
    """The spec the variant's processes read at start: what to count and read, where to write;
    ``capture``: the tensors `evalpipe localize` keeps (:mod:`evalpipe.probes.capture`)."""
    functions, predicates, config_paths, absent = [], [], [], []
    for entry in names.names.values():
        if not entry.found:
            absent.append({"name": entry.name, "why": entry.error})
        elif entry.kind == "class":
            continue  # model and layer classes are compared with what was built, not counted
        elif entry.kind == "config":
            config_paths.append(entry.canonical or entry.name)
        elif entry.kind == "predicate":
            predicates.append(entry.spec_entry())
        else:
            functions.append(entry.spec_entry())
    spec = {
        "schema_version": SCHEMA_VERSION,
        "variant": variant,
        "out_dir": str(records_dir(vdir)),
        "flush_s": FLUSH_S,
        "functions": functions,
        "predicates": predicates,
        "config_paths": config_paths,
        "absent": absent,
        **({"capture": capture} if capture is not None else {}),
    }
    path = records_dir(vdir) / SPEC_FILE
    artifacts.write_json(path, spec)
    return path


def probe_env(env: dict[str, str], spec: Path) -> dict[str, str]:
    """``env`` with the probes' site directory first on PYTHONPATH and the spec named."""
    path = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, SPEC_ENV: str(spec)}


def read_records(source: Path) -> tuple[list[ProcessProbe], list[str]]:
    """The per-process records under ``source`` and, for any that cannot be read, why."""
    records, unreadable = [], []
    for path in sorted(source.glob("*.json")) if source.is_dir() else []:
        if path.name == SPEC_FILE:
            continue
        try:
            records.append(ProcessProbe.model_validate(json.loads(path.read_text(encoding="utf-8"))))
        except ValidationError as err:
            where, why = first_problem(err)
            unreadable.append(f"{path.name}: {where + ': ' if where else ''}{why}")
        except (OSError, ValueError) as err:
            unreadable.append(f"{path.name}: {str(err).splitlines()[0]}")
    records.sort(key=lambda r: (r.started_at, r.pid))
    return records, unreadable


def gather(vdir: Path, variant: str, mode: str, names: VariantNames, *, source: Path | None = None,
           server_of: str | None = None, live: bool = False, exposed: dict[str, Any] | None = None,
           deployment_nodes: int | None = None) -> VariantProbes:
    """probes.json of a finished variant, from its processes' records (``source``: another
    variant's record directory, for an A/A run on that variant's server; ``live``: the
    processes still run, so wait out one flush first). Endpoint mode: what the server
    exposes, and no records."""
    if live:
        time.sleep(2 * FLUSH_S)
    if mode == "endpoint":
        doc = VariantProbes(variant=variant, mode="endpoint", verifiable=False, names=_names(names), exposed=exposed or {})
    else:
        records, unreadable = read_records(source or records_dir(vdir))
        doc = VariantProbes(variant=variant, mode=mode, verifiable=True, names=_names(names), server_of=server_of,  # type: ignore[arg-type]
                            unreadable=unreadable, deployment_nodes=deployment_nodes, processes=records)
    artifacts.write_text(vdir / PROBES_JSON, doc.model_dump_json(indent=2) + "\n")
    _into_manifest(vdir, doc)
    return doc


def _names(names: VariantNames) -> dict[str, str | None]:
    return {n: (e.canonical if e.found else None) for n, e in sorted(names.names.items())}


def _into_manifest(vdir: Path, doc: VariantProbes) -> None:
    """The summary for readers of the manifest, and probes.json among the verified artifacts
    (when the variant finished: a failed one has no record to join)."""
    path = artifacts.VariantDir(vdir).manifest
    if not path.is_file():
        return
    manifest = read_manifest(path)
    update: dict[str, Any] = {"probes": summarize(doc, list(doc.names))}
    if manifest.artifacts is not None:
        update["artifacts"] = {**manifest.artifacts, PROBES_JSON: ArtifactEntry.model_validate(describe_file(vdir / PROBES_JSON))}
    write_manifest(path, manifest.model_copy(update=update))


def read_probes(vdir: Path) -> VariantProbes | None:
    """A variant's probes.json, or None when it has none (a run from before the probes)."""
    path = vdir / PROBES_JSON
    if not path.is_file():
        return None
    try:
        return VariantProbes.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError) as err:
        first = str(err).splitlines()[0]
        raise UserError(f"{path} cannot be read as a probe record ({first}); re-run the variant.") from None
