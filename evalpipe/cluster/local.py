"""A Ray cluster of several nodes on this machine's loopback: the cluster the tests and the
benchmark run on, and a way to try a cluster run on a laptop.

    python -m evalpipe.cluster.local up --node CPU=1,node_a=1 --node CPU=1,node_b=1 --dir /tmp/evp-ray
    python -m evalpipe.cluster.local down --dir /tmp/evp-ray

Every node is a real `ray start` (the head with the GCS, each with its own raylet,
object store and resources), pinned to 127.0.0.1 (:mod:`evalpipe.cluster.loopback`):
nothing listens on the network. Ray's token authentication is off for it (only this
machine can reach it). Every process of the cluster, and whatever its actors start,
carries :data:`MARK_ENV` in its environment, which is how `down` finds them all.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from evalpipe.config.cluster import check_variant_resources
from evalpipe.process_table import carrying

MARK_ENV = "EVALPIPE_LOCAL_RAY_CLUSTER"
ADDRESS_FILE = "address"


@dataclass
class LocalCluster:
    root: Path
    address: str
    nodes: list[dict[str, float]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """What a driver of this cluster needs in its environment."""
        return {"RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": self.address}

    def stop(self) -> None:
        stop_marked(self.root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_args(resources: dict[str, float]) -> list[str]:
    cpus = resources.get("CPU", 1.0)
    custom = {k: v for k, v in resources.items() if k != "CPU"}
    # no log monitor: evalpipe's drivers connect with log_to_driver=False and every process it
    # starts writes its own log, so the monitor would only poll files for no reader
    args = ["--num-cpus", f"{int(cpus)}", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
            "--object-store-memory", str(96 * 1024 * 1024), "--include-log-monitor=false"]
    if custom:
        args += ["--resources", json.dumps(custom)]
    return args


def _start_env(root: Path) -> dict[str, str]:
    env = {**os.environ, MARK_ENV: str(root), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return env


def start(nodes: list[dict[str, float]], root: Path, python: str = sys.executable, timeout_s: float = 120.0) -> LocalCluster:
    """Start the head (the first node) and the other nodes; return once all are up."""
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = _start_env(root)
    base = [python, "-m", "evalpipe.cluster.ray_cli", "start"]
    # the temp dir is short: Ray's Unix sockets live under it (108 bytes at most)
    head = base + ["--head", "--port", str(port), "--temp-dir", str(root / "t"), "--include-dashboard=false",
                   "--ray-client-server-port", str(_free_port())] + _node_args(nodes[0])
    try:
        _run_start(head, env, timeout_s, "the head node")
        # one after another: nodes of one machine that join at once time out in Ray's start-up
        for i, resources in enumerate(nodes[1:], start=1):
            _run_start(base + ["--address", address] + _node_args(resources), env, timeout_s, f"local node {i}")
        _wait_for_nodes(address, len(nodes), env, python, timeout_s)
    except BaseException:
        stop_marked(root)
        raise
    (root / ADDRESS_FILE).write_text(address)
    return LocalCluster(root, address, nodes)


def join(address: str, resources: dict[str, float], root: Path, live_after: int, python: str = sys.executable,
         timeout_s: float = 120.0) -> LocalCluster:
    """One more node for the cluster at ``address``, marked by a ``root`` of its own so that
    it can be stopped (or killed, as a machine that dies) alone; return once the cluster has
    ``live_after`` live nodes."""
    root.mkdir(parents=True, exist_ok=True)
    env = _start_env(root)
    try:
        _run_start([python, "-m", "evalpipe.cluster.ray_cli", "start", "--address", address] + _node_args(resources),
                   env, timeout_s, "the joining node")
        _wait_for_nodes(address, live_after, env, python, timeout_s)
    except BaseException:
        stop_marked(root)
        raise
    return LocalCluster(root, address, [resources])


def _run_start(command: list[str], env: dict[str, str], timeout_s: float, what: str) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"`ray start` of {what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")


def _wait_for_nodes(address: str, count: int, env: dict[str, str], python: str, timeout_s: float) -> None:
    probe = ("import ray,sys;from evalpipe.cluster.loopback import pin_to_loopback;pin_to_loopback();"
             f"ray.init(address={address!r},_node_ip_address='127.0.0.1',logging_level='ERROR',log_to_driver=False);"
             "print(sum(1 for n in ray.nodes() if n['Alive']))")
    deadline = time.monotonic() + timeout_s
    seen = "0"
    while time.monotonic() < deadline:
        done = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=timeout_s)
        seen = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "?"
        if seen == str(count):
            return
        time.sleep(1.0)
    raise RuntimeError(f"the local Ray cluster at {address} has {seen} of {count} nodes after {timeout_s:g}s")


def marked_pids(root: Path) -> list[int]:
    """Processes whose environment carries this cluster's mark (Linux /proc)."""
    return carrying(f"{MARK_ENV}={root}")


def stop_marked(root: Path, grace_s: float = 5.0) -> None:
    """SIGTERM every process of the cluster, SIGKILL what is left after ``grace_s``, and
    return once none is left (a killed process leaves /proc a moment later)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for pid in marked_pids(root):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while marked_pids(root) and time.monotonic() < deadline:
            time.sleep(0.2)


def _parse_node(text: str) -> dict[str, float]:
    """One node's resources from NAME=AMOUNT,... (an argparse type: a problem is its one sentence)."""
    resources: dict[str, float] = {}
    for part in text.split(","):
        name, equals, amount = (piece.strip() for piece in part.partition("="))
        if not equals or not name:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} in {text!r} is not NAME=AMOUNT; give e.g. CPU=1,node_a=1")
        if name in resources:
            raise argparse.ArgumentTypeError(f"{name} is given twice in {text!r}; give each resource once")
        try:
            resources[name] = float(amount)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={amount!r} in {text!r} is not a number; give e.g. {name}=1") from None
    try:
        checked = check_variant_resources(resources)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    cpus = checked.get("CPU", 1.0)
    if cpus != int(cpus):
        raise argparse.ArgumentTypeError(f"CPU={cpus:g} in {text!r}: `ray start` takes a whole number of CPUs")
    return dict(checked)


def _cluster_dir(text: str) -> Path:
    """--dir: a directory, or a path where one can be made (an argparse type)."""
    path = Path(text).expanduser()
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give the cluster's directory, e.g. /tmp/evp-ray")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory; give a directory (made if missing)")
    return path.resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.cluster.local", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up", help="start the nodes; prints the address")
    up.add_argument("--node", action="append", required=True, type=_parse_node,
                    help="one node's resources, e.g. CPU=1,node_a=1 (repeat per node; CPU a whole number, 1 if absent)")
    up.add_argument("--dir", required=True, type=_cluster_dir, help="the cluster's directory (short: Ray's sockets live in it)")
    down = sub.add_parser("down", help="stop every process of the cluster")
    down.add_argument("--dir", required=True, type=_cluster_dir)
    args = parser.parse_args(argv)
    if args.verb == "up":
        if marked_pids(args.dir):
            parser.error(f"a local cluster already runs under {args.dir}; stop it first: "
                         f"python -m evalpipe.cluster.local down --dir {args.dir}")
        try:
            cluster = start(args.node, args.dir)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:  # start() has stopped what it started
            print(f"error: the local cluster did not start, nothing of it is left running: {_first_line(err)}", file=sys.stderr)
            return 3
        print(cluster.address)
        print(f"drivers need RAY_AUTH_MODE=disabled; stop it with: python -m evalpipe.cluster.local down --dir {args.dir}",
              file=sys.stderr)
        return 0
    running = marked_pids(args.dir)
    if not running:
        print(f"no local cluster runs under {args.dir} (no process carries its mark); nothing to stop", file=sys.stderr)
        return 0
    stop_marked(args.dir)
    print(f"stopped the local cluster under {args.dir} ({len(running)} process{'es' if len(running) != 1 else ''})", file=sys.stderr)
    return 0


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


if __name__ == "__main__":
    raise SystemExit(main())
