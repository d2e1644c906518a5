"""The engine a variant's job asks for: in-process vLLM (engines.OfflineEngine), a vLLM
server over HTTP (http_engine.HttpEngine), or, for evalpipe's own tests only, the fake
engine (fake_engine.py) when its environment variable is set."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from evalpipe.documents.worker_job import ServerJob
from evalpipe.worker import fake_engine
from evalpipe.worker.engines import Engine, OfflineEngine
from evalpipe.worker.http_engine import HttpEngine
from evalpipe.worker.journal import RequestJournal


def build_engine(kind: str, engine_args: dict[str, Any], server: ServerJob | None = None,
                 on_wait: Callable[[float], None] | None = None, journal: Path | None = None) -> Engine:
    """``offline``: vllm.LLM(**engine_args) here; ``http``: the server ``server`` describes
    (url, model, client settings), waiting until it is ready. Both answer from ``journal``
    (worker/journal.py) what an earlier attempt already asked. An offline variant whose
    environment sets the fake engine's variable gets the fake engine (tests of what
    surrounds the engine; never a config setting)."""
    kept = RequestJournal(journal) if journal is not None else None
    if kind == "offline" and fake_engine.requested():
        return fake_engine.build_fake_engine(engine_args, journal=kept)
    if kind == "offline":
        return OfflineEngine(engine_args, journal=kept)
    if kind == "http":
        # lazy: lm-eval builds its requests while the server is still starting
        if server is None:
            raise ValueError("an http engine needs the job's server settings")
        return HttpEngine(server, on_wait=on_wait, lazy=True, journal=kept)
    raise ValueError(f"unknown engine kind {kind!r}; known: offline, http")
