"""The pre-imported interpreters of one run: a worker forked from an interpreter that has
imported torch, transformers and lm-eval already, instead of a new one importing them again.

One fork server (evalpipe/execution/forkserver.py) per interpreter and environment the run's
real-engine workers ask for, started by the first of them and stopped with the run; each
worker's command goes through the server's client, which starts a new interpreter itself
whenever the server cannot start the worker faithfully. Measured in docs/measured.md: a
fifth less CPU for a three-engine run on a 2-core CPU machine, the same tokens bitwise.
`EVALPIPE_PREIMPORT=off` in evalpipe's environment starts every worker in a new interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from evalpipe.execution.forkserver import comparable_env
from evalpipe.execution.launch import guarded_popen, stop_group

FORKSERVER = Path(__file__).with_name("forkserver.py")
SWITCH_ENV = "EVALPIPE_PREIMPORT"
# evalpipe.worker.fakes.engine.FAKE_ENGINE_ENV (the parent never imports the worker; a test
# holds the two equal): a fake worker imports none of what a server would
FAKE_ENGINE_ENV = "EVALPIPE_FAKE_ENGINE"

# What a worker of vLLM's imports before its engine starts, vLLM and evalpipe excepted (the
# path probes hook those as they import): torch with the compiler modules vLLM's import pulls
# in, transformers' auto classes and generation (scikit-learn with them), lm-eval's model API.
MODULES = (
    "torch", "torch._dynamo", "torch._inductor.lowering", "torch._inductor.standalone_compile",
    "transformers", "transformers.models.auto.image_processing_auto", "transformers.generation", "sklearn.metrics",
    "lm_eval.api.model", "lm_eval.api.instance", "lm_eval.utils", "pyarrow", "numpy", "pydantic", "httpx",
)
STOP_GRACE_S = 15.0


@dataclass
class _Server:
    proc: subprocess.Popen
    socket: Path
    folder: Path


@dataclass
class Preimport:
    """Fork servers by (interpreter, comparable environment), each started at its first use."""

    modules: tuple[str, ...] = MODULES
    servers: dict[tuple[str, tuple[tuple[str, str], ...]], _Server] = field(default_factory=dict)

    def command(self, python: str, command: list[str], env: dict[str, str]) -> list[str]:
        """``command`` (``python -m MODULE ...``: a worker, a vLLM API server) as it is started:
        through a fork server, unless evalpipe is told not to, the process is the fake
        engine's, or the command is not the interpreter's own ``-m``."""
        if os.environ.get(SWITCH_ENV, "on") == "off" or env.get(FAKE_ENGINE_ENV) or command[:2] != [python, "-m"]:
            return command  # a launcher's or a custom command: no server would start it, so none is started
        key = (python, tuple(sorted(comparable_env(env).items())))
        server = self.servers.get(key) or self._start(key, python, env)
        return [python, "-I", str(FORKSERVER), "run", str(server.socket), "--", *command]

    def _start(self, key: tuple[str, tuple[tuple[str, str], ...]], python: str, env: dict[str, str]) -> _Server:
        folder = Path(tempfile.mkdtemp(prefix="evalpipe-fork-", dir="/tmp"))  # short: a socket's path is
        sock = folder / "s"
        with open(folder / "server.log", "wb") as log:
            proc = guarded_popen([python, str(FORKSERVER), "serve", str(sock), *self.modules], STOP_GRACE_S,
                                 stdout=log, stderr=subprocess.STDOUT, env=comparable_env(env))
        # bound before it imports anything: a client that comes early waits in its backlog
        while not sock.exists() and proc.poll() is None:
            time.sleep(0.02)
        server = _Server(proc, sock, folder)
        self.servers[key] = server
        return server

    def close(self) -> None:
        for server in self.servers.values():
            stop_group(server.proc, STOP_GRACE_S)
            shutil.rmtree(server.folder, ignore_errors=True)
        self.servers.clear()

    def __enter__(self) -> Preimport:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
