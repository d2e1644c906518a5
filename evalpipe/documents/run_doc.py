"""run.json: what a run is (its resolved config, tasks, variants and their settings, the
A/A noise floor) and how it went (status, per-variant outcome, timings, verdict).

Written by the runner (from evalpipe.pipeline.plan.run_info, then after every step) and by
`evalpipe compare` (the verdict); read by the comparison (reference, variants, gates,
expectations, noise floor), resume, the history, nightly and calibrate.

A field a run never set is left out of the file (a run that has not been compared has no
verdict), so a reader takes the model's default for it. Version 1 is the first typed
version; a version-less run.json (earlier evalpipe, hand-built run directories) is
migrated explicitly by :func:`_migrate_unversioned`.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Final, Literal

from evalpipe.atomic_files import write_json
from evalpipe.config.expectations import Expectations
from evalpipe.config.gate_settings import Gates
from evalpipe.config.run_config import aa_variant_name
from evalpipe.documents.base import Document, read_json_object, validated
from evalpipe.documents.comparison import Status
from evalpipe.errors import UserError
from evalpipe.redact import redact

RUN_JSON = "run.json"  # the run directory's own document, at its top

RUN_VERSION: Final = 1
REMEDY = "fix it, or restore it from a copy"

class RunStatus(str, Enum):
    """Where a run stands, as its run.json says (its verdict is the comparison's Status)."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


class NoiseFloorEntry(Document):
    """The A/A run: ``variant`` repeats ``of`` (the reference) with another batch arrangement."""

    variant: str
    of: str | None = None
    reverse_order: bool = False


class VariantSettings(Document):
    """What distinguishes a variant (evalpipe.pipeline.plan), credentials redacted."""

    description: str | None = None
    python: str | None = None
    env: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    launch: dict[str, Any] = {}  # config.Launch, its non-default fields
    # config.Expectations, its non-default fields: validated where it is judged
    # (RunDocument.expectations_of), so a bad entry is named there and costs no other reader
    expect: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None  # what the variant's worker measured


class VariantStatus(Document):
    exit_code: int | None = None
    seconds: float | None = None
    error: str | None = None
    stalled: bool | None = None  # True: the watchdog stopped it


class VariantPlacement(Document):
    """Where a variant ran when the run used a Ray cluster (a local run has none)."""

    cluster: str  # the address evalpipe was given
    node_id: str
    node_ip: str
    hostname: str
    resources: dict[str, float]  # what Ray assigned to the variant's unit
    shared_filesystem: bool


class Attempt(Document):
    """One continuation of an interrupted run (evalpipe.rundir.resume)."""

    at: float
    kept: list[str] = []
    previous_status: str | None = None


class RunModel(Document):
    """The model a run used: the directory its engines load, and for a built-in model its
    name and the fingerprint of its shipped files. The runner resolves it once and hands
    this same object to every variant's job and server."""

    path: str | None = None
    fingerprint: str | None = None
    builtin: bool | None = None
    name: str | None = None

    @property
    def directory(self) -> str:
        """The directory the engines load (a resolved model always has one)."""
        if self.path is None:
            raise ValueError("the run's model was not resolved to a directory")
        return self.path


class Fingerprints(Document):
    config_sha256: str | None = None
    code: str | None = None


class Timings(Document):
    model_s: float | None = None
    total_s: float | None = None


class SimulatedNight(Document):
    """`evalpipe nightly-sim`: which simulated night this is, and whose artifacts its `sp` holds."""

    night: int
    sp_from: str


class RunDocument(Document):
    version: Literal[1] = RUN_VERSION
    # what the run is (evalpipe.pipeline.plan.run_info)
    run_id: str = ""
    kind: Literal["run", "nightly"] | None = None  # None: a run
    components: dict[str, str] = {}  # nightly: the components CI named
    config_path: str | None = None
    # The RunConfig as resolved, dumped and redacted. Kept a mapping: a run from an older
    # evalpipe need not validate against today's RunConfig, and only its gates are read
    # (gates_of, validated there so a bad entry is one sentence naming it).
    config: dict[str, Any] = {}
    fingerprints: Fingerprints = Fingerprints()
    task_selector: str | None = None
    tasks: list[dict[str, Any]] = []  # config.TaskSpec mappings with their group (the worker job's tasks)
    reference: str | None = None
    variants: list[str] = []
    variant_settings: dict[str, VariantSettings] = {}
    noise_floor: NoiseFloorEntry | None = None
    model: RunModel = RunModel()
    notes: list[str] = []
    # how it went (evalpipe.pipeline.runner, evalpipe.rundir.resume)
    status: RunStatus | None = None
    started_at: float | None = None
    variant_status: dict[str, VariantStatus] = {}
    placements: dict[str, VariantPlacement] = {}  # a run on a Ray cluster: where each variant ran
    timings: Timings = Timings()
    versions: dict[str, Any] | None = None  # the reference's, for the report's header
    hardware: dict[str, Any] | None = None
    verdict: Status | None = None
    error: str | None = None
    failed_variants: list[str] = []
    interrupted_by: str | None = None
    interrupted_at: float | None = None
    finished_variants: list[str] = []
    attempts: list[Attempt] = []
    simulated: SimulatedNight | None = None

    def updated(self, **changes: Any) -> RunDocument:
        """This document with ``changes``, validated (a copy: documents are frozen)."""
        kept = {k: getattr(self, k) for k in self.model_fields_set if k not in changes}
        return type(self).model_validate({**kept, **changes})

    def without(self, *keys: str) -> RunDocument:
        """This document with ``keys`` back to unset (left out of the file)."""
        return type(self).model_validate({k: getattr(self, k) for k in self.model_fields_set if k not in keys})

    @property
    def aa_variant(self) -> str | None:
        """The A/A noise-floor variant the run names, if any."""
        return self.noise_floor.variant if self.noise_floor is not None else None

    def noise_floor_of(self, reference: str) -> str | None:
        """The A/A variant of ``reference``, else None: an A/A run of another variant (the
        reference was overridden) is no noise floor for this reference, and is then
        compared like any variant."""
        name = self.aa_variant
        return name if name and name == aa_variant_name(reference) else None

    def gates_of(self, where: str = RUN_JSON) -> Gates:
        """The gates of the run's config, else the defaults; ``where`` names the file in errors."""
        data = self.config.get("gates")
        return Gates() if data is None else validated(Gates, data, where, REMEDY, at="config.gates")

    def expectations_of(self, variant: str, where: str = RUN_JSON) -> Expectations | None:
        """The variant's effective expectations as the run recorded them, None for a run
        from before expectations existed."""
        settings = self.variant_settings.get(variant)
        data = settings.expect if settings is not None else None
        return None if data is None else validated(Expectations, data, where, REMEDY, at=f"variant_settings.{variant}.expect")

    def as_mapping(self) -> dict[str, Any]:
        """The fields the run set, as JSON values: what the reports render."""
        return self.model_dump(mode="json", exclude_unset=True)


def run_json_of(where: Path) -> Path:
    """run.json of a run directory, or ``where`` itself when it names the file."""
    where = Path(where)
    return where if where.name == RUN_JSON and not where.is_dir() else where / RUN_JSON


def write_run_document(path: Path, doc: RunDocument) -> None:
    """Atomically, credentials redacted (errors quote server commands, log tails and messages)."""
    write_json(run_json_of(path), redact({**doc.as_mapping(), "version": RUN_VERSION}))


def _migrate_unversioned(raw: dict[str, Any]) -> dict[str, Any]:
    """A run.json from before run.json had a version (earlier evalpipe, run directories built
    by hand) as version 1: it adds ``version``; "variants" given as objects ({"name": ...,
    settings}) or as a mapping of name to settings become the list of names, their settings
    joining "variant_settings"; a "model" given as a bare string becomes {"path": ...}.
    Every other field had the same name and shape."""
    out = {**raw, "version": RUN_VERSION}
    variants = raw.get("variants")
    if isinstance(variants, (dict, list)):
        items = list(variants.items()) if isinstance(variants, dict) else [
            (v, {}) if isinstance(v, str) else (v.get("name"), {k: s for k, s in v.items() if k != "name"})
            for v in variants if isinstance(v, str) or isinstance(v, dict) and v.get("name")
        ]
        out["variants"] = [str(name) for name, _ in items]
        settings = {str(name): s for name, s in items if isinstance(s, dict) and s}
        if settings:
            out["variant_settings"] = {**settings, **(raw.get("variant_settings") or {})}
    if isinstance(raw.get("model"), str):
        out["model"] = {"path": raw["model"]}
    return out


def read_run_document(where: Path) -> RunDocument | None:
    """run.json of a run directory (or the file itself), None when there is none; anything
    unreadable or of another version is one sentence naming the file."""
    path = run_json_of(where)
    if not path.is_file():
        return None
    raw = read_json_object(path, "restore it from a copy, or run the tasks again with `evalpipe run`")
    if "version" not in raw:
        raw = _migrate_unversioned(raw)
    elif raw["version"] != RUN_VERSION:
        raise UserError(f"{path} is a run.json of version {raw['version']!r}; this evalpipe reads version {RUN_VERSION}: "
                        "compare the run with the evalpipe that wrote it, or run it again.")
    return validated(RunDocument, raw, str(path), REMEDY)
