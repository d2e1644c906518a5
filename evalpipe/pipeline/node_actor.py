"""The Ray actor that runs one unit of a run on the node Ray placed it on.

A unit is a variant and the A/A run that reuses its server, if any. The actor runs them
exactly as a local run does (:func:`evalpipe.pipeline.launching.run_and_close`: the
worker, the server, the guard that takes them down if the actor dies, the watchdog,
probes.json), in a run directory of its node: the driver's own path when the nodes share
its filesystem, a scratch directory otherwise. The driver polls its events, hands it the
reference's sequences for teacher forcing, and packs its directories back when it ends.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalpipe.cluster import transfer
from evalpipe.documents.run_doc import RunModel
from evalpipe.documents.worker_events import StageEvent, WorkerEvent
from evalpipe.errors import ExitCode
from evalpipe.execution import launch
from evalpipe.execution.deployment import NodePlaces, NodeRunner
from evalpipe.execution.launch import VariantOutcome
from evalpipe.pipeline.deployment_nodes import RayNode
from evalpipe.pipeline.launching import Limits, run_and_close, stop_unneeded
from evalpipe.pipeline.plan import RunPlan
from evalpipe.probing.names import VariantNames


@dataclass
class UnitJob:
    """What the driver sends: the plan (its run_dir and baseline already this node's), the
    unit's variants in order, the resolved model, the probed names, the limits."""

    plan: RunPlan
    variants: list[str]
    model: RunModel
    names: dict[str, VariantNames]
    limits: Limits
    driver_omp_threads: str | None  # the driver's OMP_NUM_THREADS (Ray sets its own in actors)
    scratch: bool  # run_dir is this unit's copy on its node (not the shared run directory)
    # a deployment's other nodes: the NodeActor holding each node's bundle, node 1 first
    node_actors: list[Any] = dataclasses.field(default_factory=list)


@dataclass
class NodePlace:
    node_id: str
    node_ip: str
    hostname: str
    pid: int
    resources: dict[str, float]


class UnitActor:
    """Ray makes this class an actor (``ray.remote(UnitActor)``); a thread runs the unit
    while the driver's calls (events, files, stop) are served beside it."""

    def __init__(self, job: UnitJob):
        self.job = job
        if job.scratch:  # an earlier attempt's copy (a driver killed mid-run): the driver sends what it kept
            shutil.rmtree(job.plan.run_dir.parent, ignore_errors=True)
        self.events: list[tuple[str, str]] = []  # (variant, event JSON), in order
        self.outcomes: dict[str, VariantOutcome] = {}
        self.failure: str | None = None  # a bug in the actor itself
        self.done = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # Ray sets OMP_NUM_THREADS to the actor's CPUs; a variant's engine gets the thread count
        # it has when run by hand on that node (the driver's setting, else none).
        if job.driver_omp_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = job.driver_omp_threads
        # An engine that asks for vLLM's Ray executor or Ray data parallelism joins this
        # cluster (its ray.init reads RAY_ADDRESS) and places its ranks there itself.
        import ray

        os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)

    def place(self) -> NodePlace:
        import ray

        context = ray.get_runtime_context()
        assigned = context.get_assigned_resources()
        return NodePlace(node_id=context.get_node_id(), node_ip=ray.util.get_node_ip_address(),
                         hostname=socket.gethostname(), pid=os.getpid(),
                         resources={k.split("_group_")[0]: float(v) for k, v in assigned.items()})

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="evalpipe-unit", daemon=True)
        self._thread.start()

    def poll(self, since: int) -> tuple[list[tuple[str, str]], bool, dict[str, VariantOutcome], str | None]:
        """Events from index ``since`` on; whether the unit is done, its outcomes, a crash's traceback."""
        with self._lock:
            return self.events[since:], self.done, dict(self.outcomes), self.failure

    def put_dir(self, where: str, packed: bytes) -> None:
        """A packed directory (the reference's, finished; a nightly's baseline) to ``where``:
        a path, or a variant's name in this node's run directory."""
        target = Path(where) if os.path.isabs(where) else self.job.plan.run_dir / where
        target.parent.mkdir(parents=True, exist_ok=True)
        transfer.unpack_into(packed, target)

    def pack(self, variant: str) -> bytes:
        return transfer.pack(self.job.plan.run_dir / variant)

    def stop(self) -> None:
        """The run is stopping: the unit's worker and server are stopped as on Ctrl-C."""
        launch.interrupts.append(signal.SIGTERM)

    def clear_scratch(self) -> None:
        """This unit's copy of the run on its node, once the driver holds it (the driver
        calls it only when the run directory is not shared)."""
        shutil.rmtree(self.job.plan.run_dir.parent, ignore_errors=True)

    def _emit(self, variant: str, event: WorkerEvent) -> None:
        with self._lock:
            self.events.append((variant, event.model_dump_json()))

    def _run(self) -> None:
        job = self.job
        servers: dict[str, Any] = {}
        variants = [job.plan.variant(name) for name in job.variants]
        try:
            for i, variant in enumerate(variants):
                first_failed = next((o for o in self.outcomes.values() if not o.ok), None)
                if first_failed is not None:  # the A/A run that reuses a failed variant's server
                    self._finish(VariantOutcome(variant.name, ExitCode.FAILED, 0.0,
                                                f"not run: {first_failed.name}, whose server it reuses, failed"))
                    continue
                vdir = job.plan.run_dir / variant.name
                self._emit(variant.name, StageEvent(stage="node", message=f"running on {socket.gethostname()}"))
                started = time.time()
                try:
                    outcome = run_and_close(job.plan, variant, job.model, vdir,
                                            lambda e, n=variant.name: self._emit(n, e), job.limits, servers,
                                            job.names[variant.name], places=self._places(variant))
                except KeyboardInterrupt:  # stop(): the worker and server were stopped on the way out
                    outcome = VariantOutcome(variant.name, ExitCode.FAILED, time.time() - started,
                                             f"variant `{variant.name}` was stopped: the run is stopping")
                finally:
                    stop_unneeded(servers, variants[i + 1:])
                self._finish(outcome)
        except BaseException:  # noqa: BLE001 - a bug here must reach the driver, not die in a thread
            with self._lock:
                self.failure = traceback.format_exc()
        finally:
            stop_unneeded(servers, [])
            with self._lock:
                self.done = True

    def _places(self, variant: Any) -> NodePlaces | None:
        """Where a deployment the variant starts runs: its head here (this node's address is
        the one the other nodes reach), every other node with its NodeActor."""
        if variant.launch.deployment is None or variant.server_of or not self.job.node_actors:
            return None
        import ray

        runners: list[NodeRunner | None] = [None, *(RayNode(actor, i + 1) for i, actor in enumerate(self.job.node_actors))]
        return NodePlaces(address=str(ray.util.get_node_ip_address()), runners=runners)

    def _finish(self, outcome: VariantOutcome) -> None:
        with self._lock:
            self.outcomes[outcome.name] = outcome


def for_node(plan: RunPlan, node_run_dir: Path, node_baseline: Path | None) -> RunPlan:
    """The plan as the node sees it: its run directory (and a nightly's baseline) there."""
    return dataclasses.replace(plan, run_dir=node_run_dir,
                               teacher_baseline_dir=node_baseline if plan.teacher_baseline_dir else None)

