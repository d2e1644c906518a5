"""manifest.json: what one variant's worker ran and wrote (evalpipe.worker.main writes it as
it goes; the parent marks a stopped worker's variant failed and adds the path probes'
summary; integrity, resume, the history, compare and the runner read it).

Version 1 is the first typed version. A manifest written before it has no ``version`` and
the same fields (each added over time, so any of them may be missing): it is read as
version 1, so users' older run directories stay comparable. A manifest of any other
version, or with a key this evalpipe does not know, is refused in one sentence.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Final, Literal

from evalpipe.atomic_files import write_json
from evalpipe.config.run_config import LaunchMode
from evalpipe.documents.base import Document, validated
from evalpipe.documents.worker_job import EngineKind
from evalpipe.errors import UserError

MANIFEST_JSON = "manifest.json"  # in each variant's directory

MANIFEST_VERSION: Final = 1
REMEDY = "restore it or re-run the variant"

class ManifestStatus(str, Enum):
    """Where a variant's run stands, as its manifest.json says."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class ArtifactEntry(Document):
    """One verified file (evalpipe.rundir.integrity): what it was when the variant finished."""

    bytes: int
    sha256: str
    rows: int | None = None  # a Parquet table's row count


class DataFile(Document):
    """A data file a task read, or ``generated:ruler`` for items made in memory."""

    path: str
    sha256: str


class Hardware(Document):
    """evalpipe.machine.describe; manifests before the CPU model was recorded lack cpu and isa."""

    cpu: str | None = None
    isa: list[str] | None = None
    machine: str | None = None
    system: str | None = None
    cpus: int | None = None


class JournalSummary(Document):
    """The request journal at the variant's end: answers found from an earlier attempt, and reused."""

    file: str
    answers_found: int
    answers_reused: int


class ServerInfo(Document):
    """What a server says about itself (its URL without password, /v1/models, /version)."""

    url: str
    models: list[dict[str, Any]] = []
    version: dict[str, Any] | None = None


class EngineInfo(Document):
    """The engine as the worker found it: evalpipe.worker.engines (offline) or http_engine (a server)."""

    kind: Literal["offline", "http", "fake"]  # fake: the tests' engine (evalpipe.worker.fakes.engine), never a real run's
    max_model_len: int | None = None
    model: str | None = None  # http: the served model's name
    server: ServerInfo | None = None  # http
    ready_wait_s: float | None = None  # http: the wait for the server and the tokenizer
    tokenized_by: str | None = None  # http: "local", "server", or why the server took over
    journal: JournalSummary | None = None


class CollectiveCounts(Document):
    counts: dict[str, int]  # {calls in a forward pass: forward passes}
    forwards: int


class ProbeSummary(Document):
    """What ran, from the path probes (evalpipe.compare.code_paths.summarize)."""

    mode: str
    verifiable: bool
    processes: dict[str, int]  # role -> processes
    models: list[str]
    layers: dict[str, int]
    switches: dict[str, Any]
    calls: dict[str, int]
    absent: list[str]
    collectives_per_forward: dict[str, CollectiveCounts]
    forwards: int
    # the forward passes by their tokens, power-of-two bins keyed by their least count ("1": a
    # single request decoding alone, "2": 2-3 tokens ...), summed over the model's processes
    tokens_per_forward: dict[str, int] = {}
    server_of: str | None = None
    nodes: dict[str, list[Any]] = {}  # a deployment's node -> the data-parallel ranks its model-building processes served


class EngineCounters(Document):
    """What vLLM's own counters say the engine did over one task (evalpipe.worker.engine_counters):
    the scheduler paths it took. None: the engine does not expose that counter."""

    prefix_cache_queries: int | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int | None = None  # of those, tokens found cached (not computed again)
    preemptions: int | None = None  # requests preempted for KV-cache room (recomputed later)
    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    engine_steps: int | None = None  # scheduler iterations
    # the steps by their tokens, vLLM's buckets keyed by upper bound ("1": a single request
    # decoding alone, "8": 2-8 tokens ... "+Inf"), empty ones left out
    steps_by_tokens: dict[str, int] | None = None
    spec_decode_draft_tokens: int | None = None
    spec_decode_accepted_tokens: int | None = None


class VariantManifest(Document):
    version: Literal[1] = MANIFEST_VERSION
    variant: str
    status: ManifestStatus
    error: str | None = None  # a failed variant's one sentence
    python: str | None = None  # the variant's interpreter
    argv: list[str] = []
    env: dict[str, str] = {}  # credentials redacted
    engine_kind: EngineKind = "offline"
    launch_mode: LaunchMode = "offline"
    engine_args: dict[str, Any] = {}  # resolved, redacted
    versions: dict[str, str | None] = {}  # python, vllm, torch, ... (None: not installed)
    hardware: Hardware | None = None
    started_at: float | None = None
    finished_at: float | None = None
    data_files: dict[str, dict[str, DataFile]] = {}  # task -> split -> file
    engine: EngineInfo | None = None  # None until the engine is up (a server: until the tasks ran)
    truncated_prompts: int | None = None
    n_samples: int | None = None
    timings: dict[str, float] = {}  # seconds: engine_start_s, task:<name>_s, tasks_s, ..., total_s
    # task -> vLLM's counters over it (a served engine shared with another variant at the same
    # time counts both); a task whose engine exposes none is not listed
    engine_counters: dict[str, EngineCounters] = {}
    artifacts: dict[str, ArtifactEntry] | None = None  # a finished variant's verified files
    probes: ProbeSummary | None = None  # added by the parent once the variant's processes are done


def write_manifest(path: Path, manifest: VariantManifest) -> None:
    """A field not known (yet) is not written, as the untyped manifest did: an ``"error"``
    only for a failed variant, ``"rows"`` only for a table. Mapping values of None stay
    (a package that is not installed)."""
    write_json(path, manifest.model_dump(mode="json", exclude_none=True))


def read_manifest(path: Path) -> VariantManifest:
    """The manifest at ``path`` (a variant directory's manifest.json), a version-less one
    read as version 1; UserError in one sentence for one that cannot be read, of another
    version or with a key this evalpipe does not know."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path} cannot be read ({err}); {REMEDY}.") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} is not a variant manifest (a JSON object); {REMEDY}.")
    return validated(VariantManifest, migrate(raw, path), str(path), REMEDY)


def migrate(raw: dict[str, Any], path: Path | str = MANIFEST_JSON) -> dict[str, Any]:
    """A version-less manifest (evalpipe before version 1) as version 1: the same fields,
    now checked; any other version refused."""
    if "version" not in raw:
        return {**raw, "version": MANIFEST_VERSION}
    if raw["version"] != MANIFEST_VERSION:
        raise UserError(f"{path} is a variant manifest of version {raw['version']!r}; this evalpipe reads version "
                        f"{MANIFEST_VERSION} (and the version-less ones before it): read it with the evalpipe that wrote it.")
    return raw
