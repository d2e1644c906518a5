"""The engines a variant's job can run on, as one table the worker iterates: in-process
vLLM (engines.OfflineEngine), a vLLM server over HTTP (http_engine.HttpEngine), and, for
evalpipe's own tests and demos, the fake engine (fakes/engine.py), which takes an offline
job when its environment variable is set (never a config setting). The worker knows an
engine only by its entry: what it says as the engine starts, whether it seeds torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evalpipe.documents.worker_job import EngineKind, ServerJob
from evalpipe.worker.engines import Engine, OfflineEngine
from evalpipe.worker.fakes import engine as fake_engine
from evalpipe.worker.http_engine import HttpEngine
from evalpipe.worker.journal import RequestJournal

Waiting = Callable[[float], None]


@dataclass(frozen=True)
class EngineEntry:
    """One engine of the table. ``kind``: the job's `engine_kind` it serves; ``takes``: whether
    it takes such a job here (the first entry of the kind that does, in table order);
    ``banner``: what the worker says when it starts one; ``seeds_torch``: whether the engine
    computes with torch (the fake does not, and importing torch to seed it costs 1.5 s)."""

    name: str
    kind: EngineKind
    build: Callable[[dict[str, Any], ServerJob | None, Waiting | None, RequestJournal | None], Engine]
    takes: Callable[[], bool] = lambda: True
    banner: str | None = None
    seeds_torch: bool = True


def _http(engine_args: dict[str, Any], server: ServerJob | None, on_wait: Waiting | None,
          journal: RequestJournal | None) -> Engine:
    if server is None:
        raise ValueError("an http engine needs the job's server settings")
    # lazy: lm-eval builds its requests while the server is still starting
    return HttpEngine(server, on_wait=on_wait, lazy=True, journal=journal)


ENGINES: tuple[EngineEntry, ...] = (
    EngineEntry("fake", "offline", lambda args, _server, _wait, journal: fake_engine.build_fake_engine(args, journal=journal),
                takes=fake_engine.requested, banner=f"FAKE ENGINE ({fake_engine.FAKE_ENGINE_ENV} is set): tests only",
                seeds_torch=False),
    EngineEntry("vllm", "offline", lambda args, _server, _wait, journal: OfflineEngine(args, journal=journal)),
    EngineEntry("vllm-server", "http", _http),
)


def choose(kind: str) -> EngineEntry:
    for entry in ENGINES:
        if entry.kind == kind and entry.takes():
            return entry
    raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(dict.fromkeys(e.kind for e in ENGINES))}")


def build_engine(entry: EngineEntry, engine_args: dict[str, Any], server: ServerJob | None = None,
                 on_wait: Waiting | None = None, journal: Path | None = None) -> Engine:
    """The engine of ``entry`` (``choose``'s answer): for an offline job vllm.LLM(**engine_args)
    here; for an http one the server ``server`` describes (url, model, client settings), waiting
    until it is ready. Each answers from ``journal`` (worker/journal.py) what an earlier attempt
    already asked."""
    kept = RequestJournal(journal) if journal is not None else None
    return entry.build(engine_args, server, on_wait, kept)
