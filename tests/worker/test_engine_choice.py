"""evalpipe/worker/engine_choice.py: the table of engines a job can run on, the fake engine
one of its entries (taken for an offline job only when its variable is set)."""

from __future__ import annotations

import pytest

from evalpipe.worker import engine_choice
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV, FakeEngine


def test_an_offline_job_gets_vllm_unless_the_fake_engines_variable_is_set(monkeypatch):
    monkeypatch.delenv(FAKE_ENGINE_ENV, raising=False)
    assert engine_choice.choose("offline").name == "vllm"
    monkeypatch.setenv(FAKE_ENGINE_ENV, "0")
    assert engine_choice.choose("offline").name == "vllm"
    monkeypatch.setenv(FAKE_ENGINE_ENV, "delay=0")
    fake = engine_choice.choose("offline")
    assert fake.name == "fake" and not fake.seeds_torch and "tests only" in (fake.banner or "")
    assert engine_choice.choose("http").name == "vllm-server", "a served job is never the fake engine's"


def test_the_fake_entry_builds_the_fake_engine(monkeypatch, builtin_model_dir):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "1")
    engine = engine_choice.build_engine(engine_choice.choose("offline"), {"model": str(builtin_model_dir)})
    try:
        assert isinstance(engine, FakeEngine)
    finally:
        engine.close()


def test_an_unknown_kind_and_a_served_job_without_its_server_are_refused(monkeypatch):
    monkeypatch.delenv(FAKE_ENGINE_ENV, raising=False)
    with pytest.raises(ValueError, match=r"unknown engine kind 'grpc'; known: offline, http"):
        engine_choice.choose("grpc")
    with pytest.raises(ValueError, match="needs the job's server settings"):
        engine_choice.build_engine(engine_choice.choose("http"), {"model": "m"})


def test_the_table_serves_every_engine_kind_a_job_can_name_and_no_other():
    from typing import get_args

    from evalpipe.documents.worker_job import EngineKind
    from evalpipe.worker.engine_choice import ENGINES

    assert {e.kind for e in ENGINES} == set(get_args(EngineKind))
