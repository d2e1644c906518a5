"""job.json: what the parent tells a variant's worker to do (written by the runner, read by
evalpipe.worker.main; nightly reads which baseline a variant teacher-forced).

It is the one file of a variant that keeps the real values (the endpoint's URL, the
engine arguments as given): written owner-only, never shown. Version 1 is the first
typed version; the untyped job.json before it had the same fields.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final, Literal

from evalpipe.atomic_files import write_text
from evalpipe.config.run_config import LaunchMode, TaskSpec
from evalpipe.data.scenarios import ScenarioSpec
from evalpipe.documents.base import Document, validated
from evalpipe.errors import UserError
from evalpipe.redact import redact_text

JOB_JSON = "job.json"  # in the variant directory
JOB_VERSION: Final = 1


# The engines a job can name: in-process vLLM or a vLLM server over HTTP. The worker's engine
# table (evalpipe.worker.engine_choice.ENGINES) serves exactly these (tests/worker/test_engine_choice.py).
EngineKind = Literal["offline", "http"]

class ServerJob(Document):
    """How the worker reaches a server (serve and endpoint mode); the HTTP engine and
    doctor's endpoint check take it as it is."""

    url: str
    model: str | None = None  # the served model's name; None: the server's only model
    api_key_env: str | None = None  # the variable holding the key; the key itself is never written
    concurrency: int = 64
    request_timeout_s: float = 3600.0
    retries: int = 3
    ready_timeout_s: float = 900.0
    tokenizer: str | None = None  # a local tokenizer directory, when this machine has it
    tokenizer_args: dict[str, Any] | None = None  # tokenizer_mode, trust_remote_code, tokenizer_revision

    @property
    def shown_url(self) -> str:
        """The URL for messages, logs and the manifest: without its password."""
        return redact_text(self.url)

    def headers(self) -> dict[str, str]:
        """The request headers: the API key is read from its variable at each use, never stored."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}


class TeacherJob(Document):
    """Teacher forcing: whose sequences this variant scores, and where."""

    enabled: bool = False
    reference_dir: str | None = None  # None: the variant is the reference and scores what it just generated
    prompt_positions: dict[str, Any] | None = None  # config.PromptPositions as a mapping
    baseline_dir: str | None = None  # nightly: the baseline night's reference, scored too
    # on a cluster the reference runs beside this variant: its directory is waited for
    # (until its manifest says it ended) instead of being there already
    wait_for_reference: bool = False


class LocalizeSequence(Document):
    label: str
    token_ids: list[int]
    prompt_len: int = 0  # where generation starts (decode mode)


class LocalizeJob(Document):
    """`evalpipe localize`: prefill each sequence alone (no task runs); the engine's capture
    points, set up by the probe spec, keep the chosen rows of every module."""

    sequences: list[LocalizeSequence]
    # 0: prefill each sequence whole; N: prefill its prompt and decode N tokens greedily,
    # one forward pass each (the capture points match a one-token pass like any piece)
    decode_steps: int = 0


class WorkerJob(Document):
    version: Literal[1] = JOB_VERSION
    variant: str
    run_id: str = ""
    output_dir: str
    engine_kind: EngineKind = "offline"
    launch_mode: LaunchMode = "offline"
    journal: str | None = None  # the request journal's file name in the variant directory
    secret_env: list[str] = []  # variables whose values the manifest hides (every variant's API key variables)
    server: ServerJob | None = None  # None offline
    engine_args: dict[str, Any]
    tasks: list[TaskSpec]  # the run config's entries of the selected tasks
    topk: int
    seed: int | None = None
    data_dir: str
    reverse_order: bool = False
    longctx: dict[str, Any] | None = None  # config.LongCtxSpec as a mapping
    scenarios: ScenarioSpec | None = None  # the run's, resolved against its engine arguments (the same prompts for every variant)
    teacher: TeacherJob = TeacherJob()
    localize: LocalizeJob | None = None


def write_job(path: Path, job: WorkerJob) -> None:
    """Owner-only (0600), atomically: it holds the real URL and engine arguments."""
    write_text(path, job.model_dump_json(indent=1), private=True)


def read_job(path: Path) -> WorkerJob:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path} cannot be read as a worker job ({err}); re-run the variant.") from None
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != JOB_VERSION:
        raise UserError(f"{path} is a worker job of version {version!r}; this evalpipe reads version {JOB_VERSION}: "
                        "re-run the variant with this evalpipe.")
    return validated(WorkerJob, raw, str(path), "re-run the variant")
