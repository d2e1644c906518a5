"""The variants of a run at once on a Ray cluster (`cluster.address` / --cluster).

The driver (this process) groups the variants into units (a variant, with the A/A run
that reuses its server), asks Ray to place each in a placement group of its resources
(:mod:`evalpipe.cluster.placement`), and starts one :class:`~evalpipe.pipeline.node_actor.UnitActor`
per unit in it. Each unit has a thread here that polls its actor's events, hands it the
reference's finished directory for teacher forcing (when the nodes do not share the run
directory) and, when a variant ends, brings its directory back into the run directory,
where the runner records it exactly as a local run's. A unit that fails (its actor or
node dies, it cannot be placed) fails only its variants; on the way out, whatever
happened, every actor is stopped and every placement group removed.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from rich.markup import escape

from evalpipe.cluster import transfer
from evalpipe.cluster.checks import deployment_short
from evalpipe.cluster.placement import PlacementFailed, Slot, asked_spread, one_group, release, spread_group, wait_ready
from evalpipe.cluster.session import connect, describe_nodes, describe_resources, disconnect, nodes
from evalpipe.config.cluster import ClusterSettings
from evalpipe.documents.run_doc import RunModel, VariantPlacement
from evalpipe.documents.worker_events import read_event
from evalpipe.errors import ExitCode
from evalpipe.execution.launch import WORKER_GRACE_S, VariantOutcome, stop_if_interrupted
from evalpipe.pipeline.deployment_nodes import NodeActor
from evalpipe.pipeline.launching import Limits
from evalpipe.pipeline.node_actor import NodePlace, UnitActor, UnitJob, for_node
from evalpipe.pipeline.plan import PlannedVariant, RunPlan
from evalpipe.probing.names import VariantNames
from evalpipe.report.progress import ProgressView
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts

POLL_S = 0.5
# After the run asked a unit to stop: its worker's grace, its server's, and a margin.
STOP_WAIT_S = WORKER_GRACE_S + 45.0

Record = Callable[[PlannedVariant, VariantOutcome, "VariantPlacement | None"], None]


def units_of(plan: RunPlan, kept: list[str]) -> list[list[PlannedVariant]]:
    """The variants still to run, grouped: an A/A run that reuses a server runs after that
    server's variant, in its unit (same node, same server)."""
    units: list[list[PlannedVariant]] = []
    by_server: dict[str, list[PlannedVariant]] = {}
    for variant in plan.variants:
        if variant.name in kept:
            continue
        if variant.server_of and variant.server_of in by_server:
            by_server[variant.server_of].append(variant)
            continue
        unit = [variant]
        units.append(unit)
        by_server[variant.name] = unit
    return units


def in_bundle(slot: Slot, index: int) -> dict[str, Any]:
    """Ray actor options that hold bundle ``index`` of the slot's placement group, all its resources."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    resources = dict(slot.resources)
    cpus, gpus = resources.pop("CPU", 0.0), resources.pop("GPU", 0.0)
    return {"num_cpus": cpus, "num_gpus": gpus, "resources": resources or None, "max_concurrency": 8, "max_restarts": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.group, placement_group_bundle_index=index)}


def nodes_of(unit: list[PlannedVariant]) -> int:
    """The nodes the unit's engine spans on the cluster: a deployment's (Ray places them), else one."""
    deployment = unit[0].launch.deployment
    return deployment.nodes if deployment is not None and not unit[0].server_of else 1


def demand_of(plan: RunPlan, unit: list[PlannedVariant]) -> dict[str, float]:
    """What the unit's first variant asks for (an A/A run: its reference's)."""
    first = unit[0]
    own = plan.config.variants.get(first.aa_of or first.name)
    asked = own.resources if own is not None and own.resources is not None else plan.config.cluster.resources
    return dict(asked)


class _Cluster:
    """The driver's state of one run on the cluster, shared by the unit threads."""

    def __init__(self, plan: RunPlan, model: RunModel, rd: artifacts.RunDir, names: dict[str, VariantNames],
                 limits: Limits, reporter: Reporter, kept: list[str]):
        self.plan, self.model, self.rd, self.names, self.limits, self.reporter = plan, model, rd, names, limits, reporter
        self.settings: ClusterSettings = plan.config.cluster
        self.address = str(self.settings.address)
        self.ray = connect(self.address)
        self.view = ProgressView(reporter.console, lines=True)
        self.finished: queue.Queue[tuple[PlannedVariant, VariantOutcome, VariantPlacement | None]] = queue.Queue()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.actors: list[Any] = []
        self.groups: list[Any] = []
        self.running = 0  # units placed and not ended: while any runs, a waiting unit waits for it
        self.reference = plan.variants[0].name
        # the reference's finished directory, packed, for the nodes that do not share ours
        self.reference_pack: bytes | None = None
        self.reference_done = threading.Event()
        if self.reference in kept:
            if not self.settings.shared_filesystem:
                self.reference_pack = transfer.pack(rd.root / self.reference)
            self.reference_done.set()

    def node_run_dir(self, unit: list[PlannedVariant]) -> Path:
        """Where the unit's actor writes: the run directory itself on a shared filesystem,
        else a scratch copy of its own (several units may share one node, and its disk)."""
        if self.settings.shared_filesystem:
            return self.rd.root
        return Path(self.settings.scratch) / self.plan.run_id / unit[0].name / self.plan.run_id

    def say(self, text: str) -> None:
        self.reporter.info(f"  {escape(text)}")

    # ---- one unit, in its own thread ------------------------------------------------------
    def run_unit(self, unit: list[PlannedVariant], slot: Slot | None) -> None:
        label = " + ".join(v.name for v in unit)
        delivered: set[str] = set()
        actor = None
        own_group = slot is None
        place: NodePlace | None = None
        counted = False
        node_actors: list[Any] = []
        try:
            if self.stopping.is_set():
                raise PlacementFailed("not started: the run is stopping")
            nodes = nodes_of(unit)
            if slot is None:
                demand = demand_of(self.plan, unit)
                name = f"evalpipe/{self.plan.run_id}/{unit[0].name}"
                if nodes > 1:  # a deployment: a bundle per node, each on a node of its own
                    slot = spread_group(self.ray, [demand] * nodes, name)[0]
                    asked = asked_spread([demand] * nodes)
                else:
                    slot = one_group(self.ray, demand, name)
                    asked = describe_resources(demand)
                with self.lock:
                    self.groups.append(slot.group)
                wait_ready(self.ray, slot.group, what=f"variant {label}", asked=asked,
                           address=self.address, timeout_s=self.settings.placement_timeout_s, say=self.say,
                           cancelled=self.stopping.is_set, busy=lambda: self.running > 0)
            with self.lock:
                self.running += 1
            counted = True
            node_actors = self._start_node_actors(unit, slot, nodes)
            actor = self._start_actor(unit, slot, node_actors)
            place = self.ray.get(actor.place.remote())
            self.say(f"variant {label} runs on node {place.hostname} ({place.node_ip}, {place.node_id[:12]}) "
                     f"with {describe_resources(place.resources)}")
            self._follow(unit, actor, place, delivered)
        except PlacementFailed as err:
            self._fail_rest(unit, delivered, str(err), ExitCode.USER_ERROR, place)
        except Exception as err:  # noqa: BLE001 - whatever it was, it ends this unit only
            where = f" on node {place.hostname} ({place.node_ip})" if place is not None else ""
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            if isinstance(err, self.ray.exceptions.RayError):  # the actor or its node died, or Ray itself failed
                why = (f"the Ray actor running variant {label}{where} died or could not be reached "
                       f"({type(err).__name__}: {first}); its node's logs are in Ray's session directory "
                       "(/tmp/ray/session_latest/logs); `evalpipe run --resume` runs it again")
            else:
                why = (f"running variant {label}{where} through Ray failed ({type(err).__name__}: {first}); "
                       "`evalpipe run --resume` runs it again")
            self._fail_rest(unit, delivered, why, ExitCode.FAILED, place)
        finally:
            for node_actor in node_actors:
                if not self.settings.shared_filesystem:
                    self._quietly(node_actor.clear_scratch.remote(str(self.node_run_dir(unit).parent)))
                self._let_go(node_actor, scratch=False)
            if actor is not None:
                self._let_go(actor)
            if own_group and slot is not None:
                release(self.ray, slot.group)
            if counted:
                with self.lock:
                    self.running -= 1

    def _start_node_actors(self, unit: list[PlannedVariant], slot: Slot, nodes: int) -> list[Any]:
        """A deployment's nodes beyond the head: a NodeActor in each of the group's other bundles."""
        actors = []
        actor_class = self.ray.remote(NodeActor)
        for index in range(1, nodes):
            actor = actor_class.options(**in_bundle(slot, index), name=f"{self.plan.run_id}/{unit[0].name}/node{index}",
                                        ).remote(os.environ.get("OMP_NUM_THREADS"))
            with self.lock:
                self.actors.append(actor)
            actors.append(actor)
        for index, actor in enumerate(actors, start=1):
            self.say(f"variant {unit[0].name}: node {index} of its deployment on {self.ray.get(actor.address.remote())}")
        return actors

    def _start_actor(self, unit: list[PlannedVariant], slot: Slot, node_actors: list[Any]) -> Any:
        baseline = self.plan.teacher_baseline_dir
        node_dir = self.node_run_dir(unit)
        node_baseline = baseline
        if baseline is not None and not self.settings.shared_filesystem:
            node_baseline = node_dir.parent / "baseline" / baseline.name
        job = UnitJob(plan=for_node(self.plan, node_dir, node_baseline), variants=[v.name for v in unit],
                      model=self.model, names={v.name: self.names[v.name] for v in unit}, limits=self.limits,
                      driver_omp_threads=os.environ.get("OMP_NUM_THREADS"), scratch=not self.settings.shared_filesystem,
                      node_actors=node_actors)
        actor = self.ray.remote(UnitActor).options(**in_bundle(slot, slot.index), name=f"{self.plan.run_id}/{unit[0].name}",
                                                   ).remote(job)
        with self.lock:
            self.actors.append(actor)
        if not self.settings.shared_filesystem:
            if baseline is not None and node_baseline is not None:
                self.ray.get(actor.put_dir.remote(str(node_baseline), transfer.pack(baseline)))
            for variant in unit:  # a resumed variant starts from what the run directory kept of it (its journal)
                kept = self.rd.root / variant.name
                if kept.is_dir():
                    self.ray.get(actor.put_dir.remote(variant.name, transfer.pack(kept)))
        return actor

    def _follow(self, unit: list[PlannedVariant], actor: Any, place: NodePlace, delivered: set[str]) -> None:
        handlers = {v.name: self.view.handle(v.name) for v in unit}
        placement = self._placement(place)
        needs_reference = all(v.name != self.reference for v in unit) and not self.settings.shared_filesystem
        self.ray.get(actor.start.remote())
        seen, asked_to_stop, stop_deadline = 0, False, None
        while True:
            events, done, outcomes, crash = self.ray.get(actor.poll.remote(seen))
            seen += len(events)
            for variant, line in events:
                event = read_event(line)
                if event is not None:
                    handlers[variant](event)
            if needs_reference and self.reference_done.is_set() and self.reference_pack is not None:
                self.ray.get(actor.put_dir.remote(self.reference, self.reference_pack))
                needs_reference = False
            for name, outcome in outcomes.items():
                if name not in delivered:
                    self._bring_back(actor, unit, self.plan.variant(name), outcome, placement)
                    delivered.add(name)
            if crash is not None:
                raise RuntimeError(f"evalpipe's actor failed: {crash.strip().splitlines()[-1]}\n{crash}")
            if done:
                return
            if self.stopping.is_set() and not asked_to_stop:
                self.ray.get(actor.stop.remote())
                asked_to_stop, stop_deadline = True, time.monotonic() + STOP_WAIT_S
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                raise TimeoutError(f"it did not stop within {STOP_WAIT_S:g}s of being asked to")
            time.sleep(POLL_S)

    def _bring_back(self, actor: Any, unit: list[PlannedVariant], variant: PlannedVariant, outcome: VariantOutcome,
                    placement: VariantPlacement) -> None:
        """The variant's directory into the run directory (a no-op on a shared filesystem),
        then the runner records it."""
        if not self.settings.shared_filesystem:
            packed = self.ray.get(actor.pack.remote(variant.name))
            transfer.unpack_into(packed, self.rd.root / variant.name)
            if variant.name == self.reference and outcome.ok:
                self.reference_pack = packed
            if outcome.error:  # its log tails name files where they are now, not on the node
                outcome.error = outcome.error.replace(str(self.node_run_dir(unit)), str(self.rd.root))
        if variant.name == self.reference:
            self.reference_done.set()
        self.finished.put((variant, outcome, placement))

    def _fail_rest(self, unit: list[PlannedVariant], delivered: set[str], error: str, code: int,
                   place: NodePlace | None) -> None:
        placement = None if place is None else self._placement(place)
        for variant in unit:
            if variant.name not in delivered:
                delivered.add(variant.name)
                if variant.name == self.reference:
                    self.reference_done.set()
                self.finished.put((variant, VariantOutcome(variant.name, code, 0.0, f"variant `{variant.name}`: {error}"),
                                   placement))

    def _placement(self, place: NodePlace) -> VariantPlacement:
        return VariantPlacement(cluster=self.address, node_id=place.node_id, node_ip=place.node_ip,
                                hostname=place.hostname, resources=place.resources,
                                shared_filesystem=self.settings.shared_filesystem)

    def _quietly(self, ref: Any) -> None:
        try:
            self.ray.get(ref, timeout=30)
        except Exception:  # noqa: BLE001 - a dead actor's node keeps its scratch; nothing to free here
            pass

    def _let_go(self, actor: Any, scratch: bool = True) -> None:
        if scratch and not self.settings.shared_filesystem:
            try:
                self.ray.get(actor.clear_scratch.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor's node keeps its scratch; nothing to free here
                pass
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def tear_down(self) -> None:
        with self.lock:
            actors, groups = list(self.actors), list(self.groups)
        for actor in actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
        for group in groups:
            release(self.ray, group)


def run_on_cluster(plan: RunPlan, model: RunModel, rd: artifacts.RunDir, names: dict[str, VariantNames],
                   limits: Limits, reporter: Reporter, kept: list[str], record: Record) -> None:
    """Run every variant not ``kept`` on the cluster; ``record`` is called here, in this
    thread, as each ends (it raises when an essential variant failed: the rest are then
    stopped)."""
    units = units_of(plan, kept)
    if not units:
        return
    cluster = _Cluster(plan, model, rd, names, limits, reporter, kept)
    settings = cluster.settings
    where = "the shared run directory" if settings.shared_filesystem else f"node scratch {settings.scratch}"
    reporter.step(f"[bold]cluster[/] {escape(cluster.address)}: {len(units)} unit(s) "
                  f"({', '.join(' + '.join(v.name for v in u) for u in units)}), writing to {escape(where)}")
    pending = {v.name for u in units for v in u}
    live = [n for n in nodes(cluster.ray) if n.alive]
    for unit in [u for u in units if nodes_of(u) > 1]:  # a deployment the cluster cannot spread: fails before it starts
        short = deployment_short(" + ".join(v.name for v in unit), demand_of(plan, unit), nodes_of(unit), live)
        if short is not None:
            cluster._fail_rest(unit, set(), f"{short}; the cluster has {describe_nodes(live)}", ExitCode.USER_ERROR, None)
            units.remove(unit)
    slots: list[Slot | None] = [None] * len(units)
    pool = ThreadPoolExecutor(max_workers=len(units) if settings.distinct_nodes else (settings.concurrency or len(units)),
                              thread_name_prefix="evalpipe-unit")
    try:
        if settings.distinct_nodes:
            demands = [demand_of(plan, u) for u in units]
            spread = spread_group(cluster.ray, demands, f"evalpipe/{plan.run_id}")
            cluster.groups.append(spread[0].group)
            try:
                wait_ready(cluster.ray, spread[0].group, what=f"variants {', '.join(u[0].name for u in units)}",
                           asked=asked_spread(demands), address=cluster.address, timeout_s=settings.placement_timeout_s,
                           say=cluster.say, cancelled=cluster.stopping.is_set)
                slots = list(spread)
            except PlacementFailed as err:
                for unit in units:
                    cluster._fail_rest(unit, set(), str(err), ExitCode.USER_ERROR, None)
                units = []
        for unit, slot in zip(units, slots):
            pool.submit(cluster.run_unit, unit, slot)
        while pending:
            try:
                variant, outcome, placement = cluster.finished.get(timeout=POLL_S)
            except queue.Empty:
                stop_if_interrupted()
                continue
            pending.discard(variant.name)
            record(variant, outcome, placement)
    finally:
        cluster.stopping.set()
        try:
            pool.shutdown(wait=True, cancel_futures=True)  # each unit stops its actor, brings back what finished
            while True:  # what ended while the run was stopping: recorded, so --resume keeps it
                variant, outcome, placement = cluster.finished.get_nowait()
                if outcome.ok and variant.name in pending:
                    pending.discard(variant.name)
                    record(variant, outcome, placement)
        except queue.Empty:
            pass
        finally:  # a second Ctrl-C cuts the wait short, never the clean-up
            cluster.tear_down()
            disconnect()
