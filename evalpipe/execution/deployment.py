"""A variant's engine over several nodes, started, watched and stopped as one.

Node 0 (the head) runs vLLM's API server with its local data-parallel ranks; every other
node runs its ranks headless. Each node's process starts through that node's launcher
prefix (none: here; `[ssh, NODE]`, `[srun, -N1, -w, NODE]`, `[kubectl, exec, POD, --]`)
under the guard, so evalpipe's death takes the launcher down with it. The environment a
node needs travels on its command line (`env K=V ...` after the launcher): what evalpipe
adds to its own environment (the config's `env:`, the path probes' spec, the run and
node markers), since a remote shell starts from its own.

What a launcher cannot promise is said in docs/deployments.md: a killed `ssh` ends the
remote command only with a terminal (`ssh -tt`), `kubectl exec` not at all; evalpipe
then reaps the node through the launcher when it stops the deployment
(:mod:`evalpipe.execution.reaper`, run there as a script).

Any node's process ending while the deployment should run fails the variant in one
sentence naming the node and its ranks, stops the worker using it and every other node.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from evalpipe.config.deployment import Deployment, NodeRole, data_parallel_size, hands_to_shell, node_flags, node_layout
from evalpipe.config.run_config import Launch
from evalpipe.execution.engine_flags import as_flags, shell_line
from evalpipe.execution.launch import guarded_popen, log_tail, stop_group
from evalpipe.execution.serve import SERVER_MODULE, ServesAClient, free_port, url_of
from evalpipe.probes import NODE_ENV, SPEC_ENV
from evalpipe.process_table import RUN_ID_ENV
from evalpipe.redact import redact

REAPER_SCRIPT = Path(__file__).with_name("reaper.py")
DEPLOYMENT_ENV = "EVALPIPE_DEPLOYMENT"
FETCH_TIMEOUT_S = 120.0  # a node's probe records through its launcher
HEADLESS_MODULE = "evalpipe.worker.headless"


@dataclass(frozen=True)
class NodeCommand:
    """One node's process: its place, its exact argv, its log."""

    role: NodeRole
    argv: list[str]
    log_path: Path


def node_log(vdir: Path, index: int) -> Path:
    """The head's log is the variant's engine.log (as a single server's); node K's is node-K.log."""
    return vdir / ("engine.log" if index == 0 else f"node-{index}.log")


def node_commands(python: str, launch: Launch, engine_args: dict[str, Any], *, port: int | str, address: str,
                  rpc_port: int | str, vdir: Path, forwarded: dict[str, str] | None = None) -> list[NodeCommand]:
    """Every node's command line: launcher, the forwarded environment (remote nodes), the
    command (the head: vLLM's API server; the others: the headless entry), the node's
    data-parallel flags, then the engine arguments every node shares."""
    deployment = launch.deployment
    assert deployment is not None
    dp = data_parallel_size(engine_args)
    shared = {k: v for k, v in engine_args.items() if k != "data_parallel_size"}
    model = shared.pop("model")
    commands = []
    for role in node_layout(deployment, engine_args):
        if role.head:
            command = list(launch.command) if launch.command else [python, "-m", SERVER_MODULE]
            where = {"host": launch.host, "port": port}
        else:
            command = list(deployment.headless_command) if deployment.headless_command else [python, "-m", HEADLESS_MODULE]
            where = {}
        env_words = []
        if role.launcher:
            env_words = ["env", *(f"{k}={v}" for k, v in sorted({**(forwarded or {}), NODE_ENV: str(role.index)}.items()))]
        words = [*env_words, *command, "--model", str(model), *as_flags(where),
                 *as_flags(node_flags(role, dp, address, rpc_port)), *as_flags(shared)]  # type: ignore[arg-type]
        argv = through_launcher(deployment, role.launcher, words)
        commands.append(NodeCommand(role=role, argv=argv, log_path=node_log(vdir, role.index)))
    return commands


def reap_through(deployment: Deployment, role: NodeRole, marker: list[str], grace_s: float) -> None:
    """The reaper on ``role``'s node, through its launcher (``marker``: a deployment's token,
    or ``--run RUN_ID``); a node it cannot reach is left as it is."""
    words = ["python3", "-I", str(REAPER_SCRIPT), *marker, str(role.index), f"{grace_s:g}"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(through_launcher(deployment, role.launcher, words), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=grace_s + 30, check=False)


def through_launcher(deployment: Deployment, launcher: tuple[str, ...] | list[str], words: list[str]) -> list[str]:
    """``words`` run through ``launcher``: as they are, or each quoted for the node's shell
    when the launcher hands them to one (ssh joins them into a line that shell splits again,
    which would take a JSON engine argument apart)."""
    if hands_to_shell(deployment, launcher):
        return [*launcher, *(shlex.quote(word) for word in words)]
    return [*launcher, *words]


def forwarded_env(env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """What ``env`` adds to or changes in ``base`` (this process's environment): what a
    remote node must be told on the command line."""
    base = dict(os.environ) if base is None else base
    return {k: v for k, v in env.items() if base.get(k) != v}


class NodeRunner(Protocol):
    """Runs one node's process where that node is: here through a launcher prefix
    (:class:`LocalNode`), or on a Ray node through an actor there
    (:class:`evalpipe.pipeline.node_actor.RayNode`)."""

    def start(self, command: NodeCommand, env: dict[str, str], forwarded: dict[str, str], grace_s: float) -> None:
        """Start it; ``env`` is this process's view, ``forwarded`` what it adds (all a remote node gets)."""

    def wait(self) -> int:
        """Block until the process ends; its exit code (negative: the signal that ended it)."""

    def running(self) -> bool: ...

    def stop(self, grace_s: float) -> None: ...

    def ended_how(self, code: int) -> str:
        """How the process ended, in words ("was killed by SIGKILL")."""

    def bring_back(self, vdir: Path) -> None:
        """The node's log and path-probe records into ``vdir`` here (a no-op where they are here already)."""


def ended_how(code: int) -> str:
    if code < 0 and -code in signal.Signals._value2member_map_:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class LocalNode:
    """A node's process started here, through its launcher prefix, under the guard."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.command: NodeCommand | None = None
        self.deployment: Deployment | None = None

    def start(self, command: NodeCommand, env: dict[str, str], forwarded: dict[str, str], grace_s: float) -> None:
        self.command = command
        run_id = env.get(RUN_ID_ENV)
        if command.role.launcher and run_id and self.deployment is not None:
            # what an earlier attempt of this run left there (evalpipe killed: no reaper ran)
            reap_through(self.deployment, command.role, ["--run", run_id], grace_s)
        with open(command.log_path, "ab") as log:
            log.write((f"$ [{command.role.label}] " + " ".join(redact(command.argv)) + "\n").encode())
            log.flush()
            self.proc = guarded_popen(command.argv, grace_s, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace_s)

    def ended_how(self, code: int) -> str:
        return ended_how(code)

    def bring_back(self, vdir: Path) -> None:
        """A node behind a launcher wrote its probe records on its own disk: fetched through the
        launcher (tar to stdout), this node's only. Here, or on a shared disk, they are in place."""
        command = self.command
        if command is None or not command.role.launcher or self.deployment is None:
            return
        records = vdir / "probes"
        argv = through_launcher(self.deployment, command.role.launcher, ["tar", "-C", str(records), "-cf", "-", "."])
        fetched = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=FETCH_TIMEOUT_S, check=False)
        if fetched.returncode != 0:
            return  # nothing there: the node then shows no record, and the comparison says so naming it
        mine = f"node{command.role.index}-"
        with tarfile.open(fileobj=io.BytesIO(fetched.stdout), mode="r") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name.startswith(mine)]
            for member in members:
                member.name = Path(member.name).name
            tar.extractall(records, members=members, filter="data")


@dataclass
class _Node:
    command: NodeCommand
    runner: NodeRunner
    exit_code: int | None = None


@dataclass
class DeploymentProcess(ServesAClient):
    """A started deployment, used where a single server is (:class:`~evalpipe.execution.serve.ServerProcess`):
    ``url``, ``log_path``, ``use``, ``died``, ``death_message``, ``stop``."""

    commands: list[NodeCommand]
    url: str
    grace_s: float
    ready_timeout_s: float = 900.0
    address: str = ""  # the head's data-parallel address, as every node's command line says it
    runners: list[NodeRunner | None] = field(default_factory=list)  # per node; None or absent: LocalNode
    deployment: Deployment | None = None  # its settings (how its launchers take a command)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # in every node's environment: what the reaper looks for
    client: subprocess.Popen | None = None
    nodes: list[_Node] = field(default_factory=list)
    healthy: bool = False  # the head has answered /health: every rank joined
    _stopping: bool = False
    _death: tuple[NodeRole, int] | None = None
    _unready: str | None = None  # why the head never became ready (ranks that never came)
    _ready_deadline: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def log_path(self) -> Path:
        return self.commands[0].log_path

    @property
    def command(self) -> list[str]:
        return self.commands[0].argv

    def start(self, env: dict[str, str]) -> None:
        """Start every node (the head first: the others connect to it); a launcher that
        cannot be found stops the nodes already started and raises OSError."""
        forwarded = forwarded_env(env)
        try:
            for i, command in enumerate(self.commands):
                runner = self.runners[i] if i < len(self.runners) else None
                if runner is None:
                    runner = LocalNode()
                    runner.deployment = self.deployment
                node = _Node(command, runner)
                markers = self.markers(command.role)
                node.runner.start(command, {**env, **markers}, {**forwarded, **markers}, self.grace_s)
                self.nodes.append(node)
                threading.Thread(target=self._watch, args=(node,), name=f"node-{command.role.index}-watch",
                                 daemon=True).start()
        except OSError:
            self.stop()
            raise
        self._ready_deadline = time.monotonic() + self.ready_timeout_s
        threading.Thread(target=self._watch_ready, name="deployment-ready", daemon=True).start()

    def _watch_ready(self) -> None:
        """Until the head answers /health (vLLM's head answers only once every rank has
        joined) or the deployment ends; past ready_timeout_s the deployment fails naming
        the ranks that never came (:meth:`died` decides it, whichever asks first)."""
        with httpx.Client(timeout=5.0) as http:
            while not self._stopping and self._death is None and self._unready is None:
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        self.healthy = True
                        return
                except httpx.HTTPError:
                    pass
                if self.died:
                    return
                time.sleep(0.5)

    def _check_ready_deadline(self) -> None:
        if self.healthy or self._death is not None or self._unready is not None or not self._ready_deadline:
            return
        if time.monotonic() < self._ready_deadline:
            return
        with self._lock:
            if self._stopping or self._death is not None:
                return
            self._unready = self._describe_unready()
        self.stop_client()
        threading.Thread(target=self._stop_nodes, name="deployment-stop", daemon=True).start()

    def _describe_unready(self) -> str:
        """The head not ready within ready_timeout_s: which ranks never started an engine
        (no engine process of their node wrote a path-probe record), with their node's log."""
        self.bring_back()
        records = self.log_path.parent / "probes"
        missing = []
        for command in self.commands:
            role = command.role
            written = list(records.glob(f"node{role.index}-*.json")) if records.is_dir() else []
            if not written:
                missing.append(command)
        head = (f"the head at {self.url} did not answer /health within {self.ready_timeout_s:g}s (launch.ready_timeout_s): "
                "vLLM's head answers once every data-parallel rank has joined")
        if not missing:
            return (f"{head}; every node started an engine process, so the ranks may still be loading: raise "
                    f"launch.ready_timeout_s, or read the nodes' logs beside {self.log_path}")
        names = "; ".join(f"data-parallel {c.role.describe_ranks()} on {c.role.label} never started an engine" for c in missing)
        last = missing[-1]
        return (f"{head}; {names} (no engine process of the node wrote a path-probe record): check that node's launcher, "
                f"that it reaches {self.address} and its log.\nlast lines of {last.log_path}:\n{log_tail(last.log_path)}")

    def markers(self, role: NodeRole) -> dict[str, str]:
        """What marks a node's processes as this deployment's (the probes read the node too)."""
        return {NODE_ENV: str(role.index), DEPLOYMENT_ENV: self.token}

    def _watch(self, node: _Node) -> None:
        node.exit_code = node.runner.wait()
        with self._lock:
            if self._stopping or self._death is not None or self._unready is not None:
                return
            self._death = (node.command.role, node.exit_code)
        self.stop_client()
        # the rest of the deployment cannot serve without this node: down with it, now
        threading.Thread(target=self._stop_nodes, name="deployment-stop", daemon=True).start()

    @property
    def died(self) -> bool:
        self._check_ready_deadline()
        return (self._death is not None or self._unready is not None) and not self._stopping

    def death_message(self) -> str:
        if self._unready is not None:
            return self._unready
        assert self._death is not None
        role, code = self._death
        self.bring_back()
        how = self.nodes[role.index].runner.ended_how(code)
        log = node_log(self.log_path.parent, role.index)
        return (f"{role.label}, data-parallel {role.describe_ranks()}, {how} before the variant finished; the "
                f"deployment's other nodes were stopped.\nlast lines of {log}:\n{log_tail(log)}")

    def bring_back(self) -> None:
        """Every node's log and path-probe records into the variant's directory here."""
        for node in self.nodes:
            with contextlib.suppress(Exception):  # a node that is gone keeps what it had: the rest still come
                node.runner.bring_back(self.log_path.parent)

    def _stop_nodes(self) -> None:
        threads = [threading.Thread(target=n.runner.stop, args=(self.grace_s,), daemon=True) for n in self.nodes]
        for thread in threads:  # every node at once: each waits out its own grace period
            thread.start()
        for thread in threads:
            thread.join()
        self._reap_remote()

    def _reap_remote(self) -> None:
        """Through each remote node's launcher, end what the deployment left there (a launcher
        that does not pass on its own end, such as kubectl exec)."""
        for node in self.nodes:
            if node.command.role.launcher and self.deployment is not None:
                reap_through(self.deployment, node.command.role, [self.token], self.grace_s)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._stop_nodes()

    def wait_gone(self, timeout_s: float) -> bool:
        """Whether every node's process has ended within ``timeout_s`` (for tests and the runner)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any(n.runner.running() for n in self.nodes):
                return True
            time.sleep(0.1)
        return False


def data_parallel_address(launch: Launch) -> str:
    """Where every node finds the head: the deployment's address, else the host the head
    binds (a wildcard bind means this machine's loopback, as for the client)."""
    assert launch.deployment is not None
    if launch.deployment.address:
        return launch.deployment.address
    return launch.host if launch.host not in ("0.0.0.0", "::") else "127.0.0.1"


def head_url(launch: Launch, port: int | str) -> str:
    """Where the client finds the head: its bound host, or for a wildcard bind (a head on
    another machine, listening on all its addresses) the deployment's address."""
    assert launch.deployment is not None
    if launch.host in ("0.0.0.0", "::") and launch.deployment.address:
        host = launch.deployment.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    return url_of(launch, port)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodePlaces:
    """Where a deployment's nodes run when something placed them (a Ray placement group):
    the head's address as the others reach it, and a runner per node (None: here)."""

    address: str
    runners: list[NodeRunner | None]


def deployment_of(python: str, launch: Launch, engine_args: dict[str, Any], port: int, vdir: Path,
                  env: dict[str, str], places: NodePlaces | None = None) -> DeploymentProcess:
    """The deployment of a variant, not started yet: its ports chosen, every node's command line derived."""
    assert launch.deployment is not None
    if launch.deployment.address:
        address = launch.deployment.address
    else:  # Ray put the head on the unit's node: its address, else the one the head binds here
        address = places.address if places is not None else data_parallel_address(launch)
    rpc_port = launch.deployment.rpc_port or free_port(launch.host)
    token = uuid.uuid4().hex
    forwarded = {**forwarded_env(env), DEPLOYMENT_ENV: token}
    spec = Path(forwarded.get(SPEC_ENV, ""))
    if spec.is_file():  # a node behind a launcher may not see this file: it gets the spec itself
        forwarded[SPEC_ENV] = json.dumps(json.loads(spec.read_text(encoding="utf-8")), separators=(",", ":"))
    commands = node_commands(python, launch, engine_args, port=port, address=address, rpc_port=rpc_port, vdir=vdir,
                             forwarded=forwarded)
    return DeploymentProcess(commands=commands, url=head_url(launch, port), grace_s=launch.stop_grace_s,
                             ready_timeout_s=launch.ready_timeout_s, token=token, deployment=launch.deployment,
                             address=address,
                             runners=list(places.runners) if places is not None else [])


def planned_node_lines(variant: Any, model_path: str, variant_dir: Path, placed_by_ray: bool = False) -> list[str]:
    """What a deployment will run, for --dry-run: each node's exact command line (ports not
    fixed by the config are chosen at start), then the worker that talks to the head.
    ``placed_by_ray``: the nodes are a Ray placement group's bundles, the head's address
    that of the node Ray puts it on."""
    launch: Launch = variant.launch
    assert launch.deployment is not None
    port: int | str = launch.port if launch.port is not None else "<free port>"
    rpc_port: int | str = launch.deployment.rpc_port if launch.deployment.rpc_port is not None else "<free port>"
    forwarded = {**variant.env_overrides, SPEC_ENV: "<the variant's probe spec, inline>", RUN_ID_ENV: "<run id>",
                 DEPLOYMENT_ENV: "<a token of this start>",
                 "PYTHONPATH": "<evalpipe's probes and package>"}
    address = launch.deployment.address or ("<the head node's address>" if placed_by_ray else data_parallel_address(launch))
    commands = node_commands(variant.python, launch, {**variant.engine_args, "model": model_path}, port=port,
                             address=address, rpc_port=rpc_port, vdir=variant_dir, forwarded=forwarded)
    where = ", each node a bundle of its own Ray placement group" if placed_by_ray else ""
    lines = [f"deployment over {len(commands)} node(s), data parallel {data_parallel_size(variant.engine_args)}{where}:"]
    for command in commands:
        lines.append(f"  {command.role.label}, data-parallel {command.role.describe_ranks()} (log {command.log_path.name}):")
        lines.append("    " + shell_line(redact(command.argv)))
    worker = f"{variant.python} -m evalpipe.worker.main {variant_dir / 'job.json'}"
    lines.append(worker + f"   (client, {'on the head node' if placed_by_ray else 'here'}; talks to the head at "
                          f"{head_url(launch, port)})")
    return lines
