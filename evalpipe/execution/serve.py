"""A variant's vLLM server in serve mode: the command, its --config file, start, watch, stop.

The engine arguments go into a YAML file passed with ``--config`` (vLLM turns nested
mappings such as ``additional_config`` into JSON itself, so nothing needs quoting). The
server runs in a process group of its own, its output is the variant's engine.log, and
stopping it is SIGTERM to the group, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from evalpipe.config.run_config import Launch
from evalpipe.execution.launch import Starter, guarded_popen, log_tail, stop_group
from evalpipe.redact import redact, redact_text
from evalpipe.rundir.artifacts import write_text

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVER_ARGS_FILE = "server-args.yaml"


def server_command(python: str, launch: Launch, args_file: Path) -> list[str]:
    """launcher + server command + --config FILE. The default command is the server
    module `vllm serve` runs, under the variant's interpreter: the CPU build's `vllm`
    console command cannot start (it asks for a distribution named `vllm`)."""
    command = list(launch.command) if launch.command else [python, "-m", SERVER_MODULE]
    return [*launch.launcher, *command, "--config", str(args_file)]


def server_args(engine_args: dict[str, Any], launch: Launch, port: int) -> dict[str, Any]:
    """The --config mapping: vLLM's flag names (dashes: vLLM adds `--no-<flag>` for a
    false boolean only under the dashed name), engine args as given, host and port."""
    args = {key.replace("_", "-"): value for key, value in engine_args.items()}
    args.update(host=launch.host, port=port)
    return args


def planned_commands(variant: Any, model_path: str, variant_dir: Path) -> list[str]:
    """What a variant will run, for --dry-run: the server command and its --config
    content (serve), the server it attaches to (endpoint), or the worker (offline)."""
    launch = variant.launch
    worker = f"{variant.python} -m evalpipe.worker.main {variant_dir / 'job.json'}"
    if launch.mode == "endpoint":
        return [f"attach to {redact_text(launch.url)} (never started or stopped by evalpipe)", worker]
    if launch.mode == "offline":
        return [worker + "   (vllm.LLM in this process)"]
    if variant.server_of:
        return [f"no server of its own: {variant.server_of}'s server, still running", worker]
    args_file = variant_dir / SERVER_ARGS_FILE
    port = launch.port if launch.port is not None else "<free port>"
    content = yaml.safe_dump(redact(server_args({**variant.engine_args, "model": model_path}, launch, port)), sort_keys=False)  # type: ignore[arg-type]
    return [" ".join(redact(server_command(variant.python, launch, args_file))),
            *(f"    {line}" for line in content.rstrip().splitlines()),
            worker + "   (client, talks to the server)"]


def write_server_args(path: Path, args: dict[str, Any]) -> None:
    write_text(path, yaml.safe_dump(args, sort_keys=False), private=True)  # engine args as given, an --api-key among them


def free_port(host: str) -> int:
    """A port nothing listens on now (the OS picks it; the server binds it moments later)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def url_of(launch: Launch, port: int) -> str:
    host = launch.host if launch.host not in ("0.0.0.0", "::") else "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServesAClient:
    """A started engine a worker talks to (one server, or a deployment of several nodes):
    the worker set as its ``client`` is stopped at once when the engine dies, since it would
    otherwise wait for answers that never come."""

    client: subprocess.Popen | None

    @property
    def died(self) -> bool:
        raise NotImplementedError

    def use(self, client: subprocess.Popen) -> None:
        """``client`` now depends on this engine (stopped at once if it is already dead)."""
        self.client = client
        if self.died:
            self.stop_client()

    def stop_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.client.pid, signal.SIGTERM)

    def bring_back(self) -> None:
        """What the engine's processes wrote elsewhere (another node's log and probe
        records) into the variant's directory; one server writes here already."""
        return None


@dataclass
class ServerProcess(ServesAClient):
    """One started server. If it ends before ``stop``, the worker using it (``client``,
    set by whoever runs one) is stopped at once: it would otherwise wait for a server
    that will never answer."""

    command: list[str]
    url: str
    log_path: Path
    grace_s: float
    proc: subprocess.Popen | None = None
    exit_code: int | None = None
    client: subprocess.Popen | None = None
    # what the command becomes: through a pre-imported interpreter when it is an interpreter's
    # own `-m` (evalpipe/execution/preimport.py); None: as it is
    starter: Starter | None = None
    _stopping: bool = False

    def start(self, env: dict[str, str]) -> None:
        command = self.starter.command(self.command[0], self.command, env) if self.starter is not None else self.command
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(redact(self.command)) + "\n").encode())  # a launcher may carry a key
            log.flush()
            self.proc = guarded_popen(command, self.grace_s, stdout=log, stderr=subprocess.STDOUT, env=env)

        def watch() -> None:
            assert self.proc is not None
            self.exit_code = self.proc.wait()
            if not self._stopping:
                self.stop_client()

        threading.Thread(target=watch, name="server-watch", daemon=True).start()

    @property
    def died(self) -> bool:
        return self.exit_code is not None and not self._stopping

    def death_message(self) -> str:
        tail = log_tail(self.log_path)
        return (f"the server exited with code {self.exit_code} before the variant finished.\n"
                f"last lines of {self.log_path}:\n{tail}")

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None:
            stop_group(self.proc, self.grace_s)
