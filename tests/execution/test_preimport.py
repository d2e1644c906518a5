"""A run's pre-imported interpreters (evalpipe/execution/preimport.py): one fork server per
interpreter and environment its workers ask for, none for the fake engine or when switched
off, all stopped with the run. How a forked worker runs: tests/execution/test_forkserver.py."""

from __future__ import annotations

import os
import sys

from evalpipe.execution.forkserver import RUN_MARK
from evalpipe.execution.preimport import FORKSERVER, Preimport


def test_one_server_per_environment_and_all_stopped_with_the_run(tmp_path):
    env = {**os.environ, RUN_MARK: f"pre-{tmp_path.name}"}
    command = [sys.executable, "-m", "json.tool"]
    starter = Preimport(modules=("json",))
    first = starter.command(sys.executable, command, {**env, "EVALPIPE_LAYOUT": "legacy"})
    assert first[:4] == [sys.executable, "-I", str(FORKSERVER), "run"] and first[-3:] == command
    # evalpipe's own variables share a server; another thread count is another interpreter
    assert starter.command(sys.executable, command, {**env, "EVALPIPE_LAYOUT": "sp"}) == first
    other = starter.command(sys.executable, command, {**env, "OMP_NUM_THREADS": "2"})
    assert other != first and len(starter.servers) == 2
    procs = [server.proc for server in starter.servers.values()]
    starter.close()
    assert all(proc.poll() is not None for proc in procs) and starter.servers == {}


def test_evalpipe_preimport_off_and_the_fake_engine_keep_the_command(monkeypatch):
    from evalpipe.execution import preimport
    from evalpipe.worker.fakes import engine

    assert preimport.FAKE_ENGINE_ENV == engine.FAKE_ENGINE_ENV
    command = [sys.executable, "-m", "json.tool"]
    starter = Preimport(modules=("json",))
    assert starter.command(sys.executable, command, {**os.environ, preimport.FAKE_ENGINE_ENV: "1"}) == command
    monkeypatch.setenv("EVALPIPE_PREIMPORT", "off")
    assert starter.command(sys.executable, command, dict(os.environ)) == command
    assert starter.servers == {}


def test_a_launcher_or_another_command_is_kept_and_starts_no_server():
    starter = Preimport(modules=("json",))
    for command in (["ssh", "node1", sys.executable, "-m", "json.tool"], ["/opt/vllm/bin/vllm", "serve"],
                    [sys.executable, "script.py"]):
        assert starter.command(sys.executable, command, dict(os.environ)) == command
    assert starter.servers == {}
