"""A deployment's nodes on a Ray cluster: one placement group per deployment, a bundle per
node, spread over distinct nodes; the unit's actor (the head: API server, worker) holds the
first bundle and a :class:`NodeActor` holds each other one and runs that node's headless
process there, under the guard, as a launcher prefix would here.

The head drives them through :class:`RayNode`, the Ray runner of
:class:`evalpipe.execution.deployment.NodeRunner`: the node's process gets the environment
the deployment adds (the path probes' spec is written at the same path on its node first),
its end is reported as a local process's is, and its log and probe records are brought
back into the head's variant directory. An actor or node that dies reads as the node's
process lost, which fails the variant naming the node.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

from evalpipe import atomic_files
from evalpipe.execution.deployment import LocalNode, NodeCommand, ended_how, node_log
from evalpipe.probes import SPEC_ENV

LOST = -9  # the exit code a node's process is given when its actor or node is gone
COLLECT_TIMEOUT_S = 120.0


class NodeActor:
    """Ray makes this an actor (``ray.remote(NodeActor)``) in one bundle of a deployment's
    placement group: it runs that node's process and answers for it."""

    def __init__(self, driver_omp_threads: str | None):
        # as the unit's actor: the node's engine gets the thread count the driver has, not Ray's
        if driver_omp_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = driver_omp_threads
        self.node = LocalNode()  # its process, as one started here would be

    def address(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def start(self, command: NodeCommand, forwarded: dict[str, str], grace_s: float, files: dict[str, bytes]) -> None:
        """Write ``files`` (absolute path -> bytes: the probes' spec), then start the node's
        command here, as a launcher prefix would, with this node's environment plus ``forwarded``.
        Each file is replaced whole (written beside it, then renamed): where nodes share the
        path (one machine, or a shared filesystem), another node's process may be reading it
        as it starts, and a half-written spec would leave that node's probes inactive."""
        for path, data in files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            atomic_files.write_bytes(Path(path), data)
        command.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.node.start(command, {**os.environ, **forwarded}, forwarded, grace_s)

    def wait(self) -> int:
        return self.node.wait()

    def running(self) -> bool:
        return self.node.running()

    def stop(self, grace_s: float) -> None:
        self.node.stop(grace_s)

    def clear_scratch(self, path: str) -> None:
        """The unit's scratch copy on this node (the driver holds what mattered of it)."""
        shutil.rmtree(path, ignore_errors=True)

    def collect(self, vdir: str, node: int) -> bytes:
        """This node's log and probe records under ``vdir``, packed (paths relative to it)."""
        root = Path(vdir)
        wanted = [node_log(root, node), *sorted((root / "probes").glob(f"node{node}-*.json"))]
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in wanted:
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
        return buffer.getvalue()


class RayNode:
    """The runner of one node whose process a :class:`NodeActor` runs on its Ray node."""

    def __init__(self, actor: Any, index: int):
        import ray

        self.ray = ray
        self.actor = actor
        self.index = index
        self.lost: str | None = None  # why the actor could not be reached

    def start(self, command: NodeCommand, env: dict[str, str], forwarded: dict[str, str], grace_s: float) -> None:
        spec = forwarded.get(SPEC_ENV) or env.get(SPEC_ENV)
        inline = spec is not None and spec.lstrip().startswith("{")
        files = {spec: Path(spec).read_bytes()} if spec and not inline and Path(spec).is_file() else {}
        if spec:
            forwarded = {**forwarded, SPEC_ENV: spec}
        self.ray.get(self.actor.start.remote(command, forwarded, grace_s, files))

    def wait(self) -> int:
        try:
            return int(self.ray.get(self.actor.wait.remote()))
        except self.ray.exceptions.RayError as err:
            self.lost = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            return LOST

    def running(self) -> bool:
        try:
            return bool(self.ray.get(self.actor.running.remote(), timeout=30))
        except Exception:  # noqa: BLE001 - an actor that cannot answer runs nothing any more
            return False

    def stop(self, grace_s: float) -> None:
        try:
            self.ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 60)
        except Exception:  # noqa: BLE001 - gone already: its guard took its process down with it
            pass

    def ended_how(self, code: int) -> str:
        if self.lost is not None:
            return f"was lost with its Ray actor, its node gone or unreachable ({self.lost})"
        return ended_how(code)

    def bring_back(self, vdir: Path) -> None:
        data = self.ray.get(self.actor.collect.remote(str(vdir), self.index), timeout=COLLECT_TIMEOUT_S)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(vdir, filter="data")  # relative paths only: the node's log and its records
