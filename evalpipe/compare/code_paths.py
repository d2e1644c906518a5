"""What ran: the path probes' records as typed documents, the expectations judged against
them, and whether two variants ran different code at all.

A comparison of outputs proves something about a change only when each side ran the path
it claims. The probes (:mod:`evalpipe.probes`) write one record per engine process; the
parent gathers a variant's records into ``<variant>/probes.json`` (:class:`VariantProbes`,
versioned). Here, with no file read or written:

- :func:`check_side`: a variant's records against its expectations
  (:class:`evalpipe.config.expectations.Expectations`): failures, or the evidence that holds;
- :func:`profile`: what code a variant ran, as far as the probes see it (model and layer
  classes, functions called, collectives per forward pass);
- :func:`judge_paths`: both sides of a comparison -> ``verified`` (each side's evidence
  holds), ``failed`` (an expectation failed, a side cannot be verified: endpoint mode,
  no records, or a side declaring ``same_path`` and the reference's own expectations ran
  other code), ``same_code`` (no
  expectation tells the sides apart, the profiles and the engines' resolved settings are
  the same and the outputs IDENTICAL: nothing was compared), or ``not_recorded`` (a run
  from before the probes existed: said, not judged);
- :func:`apply_paths`: the verdict made INCONCLUSIVE when the paths say so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalpipe.compare.task_paths import check_tasks
from evalpipe.config.expectations import CountRange, Expectations, collective_key
from evalpipe.config.run_config import LaunchMode
from evalpipe.documents.comparison import FAILED, NOT_RECORDED, SAME_CODE, VERIFIED, Paths, PathStatus, SideCheck, WhatRan
from evalpipe.documents.manifest import CollectiveCounts, EngineCounters, ProbeSummary
from evalpipe.probes import SCHEMA_VERSION as RECORD_SCHEMA_VERSION
from evalpipe.probes.record import bin_size

PROBES_SCHEMA_VERSION: Final = 1
NOT_VERIFIABLE_ENDPOINT = (
    "path not verifiable in endpoint mode: the server runs outside evalpipe and exposes no record of the code it ran"
)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelProbe(_Doc):
    model_class: str
    layers: dict[str, int]
    attention_backends: list[str]
    forwards: int
    empty_forwards: int = 0
    failed_forwards: int = 0
    running_forwards: int = 0  # passes still running when the process last wrote its record
    forward_tokens: list[int]
    per_forward: dict[str, dict[str, int]]  # name -> {calls in one forward: forward passes}; "other": the rest
    per_forward_tokens: dict[str, dict[str, list[int]]] = {}  # name -> {calls in one forward: tokens of the first such passes}
    per_forward_token_range: dict[str, dict[str, list[int]]] = {}  # name -> {calls in one forward: [fewest, most] tokens}
    tokens_per_forward: dict[str, int] = {}  # passes by tokens, power-of-two bins ("1", "2", "4" ...; "other")

    @model_validator(mode="after")
    def _histograms_within_the_passes(self) -> ModelProbe:
        """A histogram counts finished passes only: more than ``forwards`` is a record that
        contradicts itself, which no count read from it could be evidence of."""
        for name, hist in self.per_forward.items():
            if sum(hist.values()) > self.forwards:
                raise ValueError(f"its {self.model_class} counts {sum(hist.values())} forward passes of `{name}`, "
                                 f"more than the {self.forwards} passes it finished: the record contradicts itself")
        return self


class ProcessProbe(_Doc):
    """One engine process's record (written by :mod:`evalpipe.probes.record`)."""

    schema_version: Literal[1] = RECORD_SCHEMA_VERSION
    variant: str
    pid: int
    ppid: int
    process_name: str
    role: str  # evalpipe_worker | api_server | engine_core | worker | other
    argv: list[str]
    node: str | None = Field(default=None, description="The node of a deployment the process ran on (its index; None: a single-node engine).")
    hostname: str | None = None
    started_at: float
    updated_at: float
    models: list[ModelProbe]
    switches: dict[str, Any]
    switch_errors: dict[str, str]
    calls: dict[str, int]
    collectives: dict[str, int]
    shapes: dict[str, list[Any]]
    absent: dict[str, str]
    errors: list[str]

    @property
    def dp_index(self) -> Any:
        """The data-parallel rank the process serves (None: not read)."""
        return self.switches.get("data_parallel_index", self.switches.get("dp_rank"))

    @property
    def label(self) -> str:
        rank = self.switches.get("tp_rank")
        dp = self.dp_index
        where = "".join(f" {k}{v}" for k, v in (("DP", dp), ("TP", rank)) if v is not None)
        node = f"node {self.node} " if self.node is not None else ""
        return f"{node}{self.role} pid {self.pid}{where}"


class VariantProbes(_Doc):
    """``<variant>/probes.json``: every engine process's record of one variant."""

    schema_version: Literal[1] = PROBES_SCHEMA_VERSION
    variant: str
    mode: LaunchMode
    verifiable: bool = Field(description="False: an endpoint whose server runs outside evalpipe (no records can exist).")
    names: dict[str, str | None] = Field(
        default_factory=dict,
        description="Each probed name as the config writes it -> the name the records count it under (None: absent here).",
    )
    server_of: str | None = Field(default=None, description="The A/A run that reused this variant's server: its records are that server's.")
    exposed: dict[str, Any] = Field(default_factory=dict, description="Endpoint mode: what the server says about itself.")
    unreadable: list[str] = Field(default_factory=list, description="Record files that could not be read, with why.")
    deployment_nodes: int | None = Field(
        default=None, description="The nodes of the deployment evalpipe started for the variant (None: one server or engine).")
    processes: list[ProcessProbe] = Field(default_factory=list)

    @property
    def builders(self) -> list[ProcessProbe]:
        """The processes that built a model (engine cores, workers, an in-process engine)."""
        return [p for p in self.processes if p.models]

    def canonical(self, name: str) -> str | None:
        return self.names.get(name, name)

    def total_calls(self, name: str) -> int:
        canonical = self.canonical(name)
        return sum(p.calls.get(canonical or "", 0) for p in self.processes)


# ---------------------------------------------------------------------------
# one side
# ---------------------------------------------------------------------------


def short(name: str) -> str:
    """`package.module.Class.method` -> `Class.method` (a class: `Class`)."""
    parts = name.removesuffix("()").split(".")
    cut = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts) - 1)
    return ".".join(parts[cut:]) + ("()" if name.endswith("()") else "")


def _n(count: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("s") else "s")
    return f"{count:,} {noun if count == 1 else plural}".replace(",", "\u202f")


def per_forward_counts(probes: VariantProbes, key: str) -> tuple[dict[str, int], int]:
    """Over the main model of every process that built one: {calls in a forward pass: forward
    passes} (zero included) and the number of forward passes."""
    canonical = key if collective_key(key) else (probes.canonical(key) or key)
    merged: dict[str, int] = {}
    forwards = 0
    for p in probes.builders:
        model = p.models[0]
        forwards += model.forwards
        hist = model.per_forward.get(canonical, {})
        for value, n in hist.items():
            merged[value] = merged.get(value, 0) + n
        zeros = model.forwards - sum(hist.values())
        if zeros:
            merged["0"] = merged.get("0", 0) + zeros
    return merged, forwards


def odd_pass_tokens(probes: VariantProbes, key: str, values: Iterable[str]) -> list[int]:
    """Token counts of the first recorded passes that made one of ``values`` calls of ``key``:
    which batches an odd count came from (decode steps, a prefill of some size)."""
    canonical = key if collective_key(key) else (probes.canonical(key) or key)
    out: list[int] = []
    for p in probes.builders:
        kept = p.models[0].per_forward_tokens.get(canonical, {})
        for value in values:
            out += kept.get(value, [])
    return out[:6]


def _counts_text(hist: dict[str, int], forwards: int) -> str:
    ordered = sorted(hist.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{value} in {n} of {forwards}" for value, n in ordered[:4]) + (", \u2026" if len(ordered) > 4 else "")


def _holds(expected: int | CountRange, value: str) -> bool:
    if value == "other":
        return False  # more distinct counts than a record keeps: not every forward pass matched
    n = int(value)
    return n == expected if isinstance(expected, int) else expected.holds(n)


def same_value(expected: Any, actual: Any) -> bool:
    """A switch's expected value against the recorded one: strings without case or a
    ``torch.`` prefix, mappings as a subset (``additional_config: {enable_dsa_cp: true}``)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and same_value(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) and all(map(same_value, expected, actual))
    if isinstance(expected, str) and isinstance(actual, str):
        return expected.lower().removeprefix("torch.") == actual.lower().removeprefix("torch.")
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    return bool(expected == actual)


def _side_check(variant: str, failures: Sequence[str], evidence: Sequence[str] = (), verifiable: bool = True,
                task_failures: Mapping[str, Sequence[str]] | None = None) -> SideCheck:
    """One variant's records against its expectations: ok when verifiable and nothing failed."""
    return SideCheck(variant=variant, ok=verifiable and not failures, verifiable=verifiable,
                     failures=tuple(failures), evidence=tuple(evidence),
                     task_failures={t: tuple(f) for t, f in (task_failures or {}).items() if f})


def check_side(variant: str, expect: Expectations, probes: VariantProbes,
               counters: Mapping[str, EngineCounters] | None = None) -> SideCheck:
    """Failures (each one sentence naming what was expected and what was seen) or the evidence;
    ``counters`` are vLLM's own per task (the manifest's), which each task's requirements read."""
    who = f"variant `{variant}`"
    if not probes.verifiable:
        return _side_check(variant, (f"{who}: {NOT_VERIFIABLE_ENDPOINT} (say so, or start it with evalpipe's probes)",), (), False)
    if not probes.processes:
        unreadable = f"; unreadable: {'; '.join(probes.unreadable)}" if probes.unreadable else ""
        return _side_check(variant, (
            f"{who}: the path probes recorded no engine process, so nothing shows which code ran (they load through "
            f"PYTHONPATH and EVALPIPE_PROBES: a launcher that drops the environment, or python -S/-E/-I, keeps them out){unreadable}",
        ), (), False)
    builders = probes.builders
    if not builders:
        roles = ", ".join(sorted({p.role for p in probes.processes}))
        return _side_check(variant, (
            f"{who}: none of its {len(probes.processes)} recorded processes ({roles}) built a model the probes saw",
        ), (), False)
    failures: list[str] = []
    evidence: list[str] = []
    where = _n(len(builders), "process")

    if expect.engine_processes is not None:
        if len(builders) != expect.engine_processes:
            labels = ", ".join(p.label for p in builders)
            failures.append(f"{who} was expected to build its model in {_n(expect.engine_processes, 'process')}; "
                            f"it did in {len(builders)} ({labels})")
        else:
            evidence.append(f"model built in {where} ({', '.join(p.label for p in builders)})")
    mains = [p.models[0] for p in builders]
    classes = sorted({m.model_class for m in mains})
    if expect.model:
        if classes != [probes.canonical(expect.model) or expect.model]:
            failures.append(f"{who} was expected to build `{expect.model}`; vLLM instantiated "
                            f"{', '.join(f'`{c}`' for c in classes)} ({where})")
        else:
            evidence.append(f"model `{short(expect.model)}` in {where}")
    layer_counts: dict[str, int] = {}
    for m in mains:
        for cls, n in m.layers.items():
            layer_counts[cls] = layer_counts.get(cls, 0) + n
    if expect.layers:
        wanted_layers = {probes.canonical(c) or c for c in expect.layers}
        other = {c: n for c, n in layer_counts.items() if c not in wanted_layers}
        if other or not layer_counts:
            seen = ", ".join(f"{n} `{c}`" for c, n in sorted(other.items())) or "no decoder layers"
            failures.append(f"{who}'s decoder layers were expected to be {' or '.join(f'`{c}`' for c in expect.layers)}; "
                            f"found {seen}")
        else:
            evidence.append(", ".join(f"{n} `{short(c)}` layers" for c, n in sorted(layer_counts.items())))

    node_failures, node_evidence = check_nodes(who, expect, probes)
    failures += node_failures
    evidence += node_evidence

    nodes = sorted({p.node for p in builders if p.node is not None}, key=int)
    for name in expect.called:
        total = probes.total_calls(name)
        if probes.canonical(name) is None:
            failures.append(f"{who} cannot have called `{name}`: it does not exist in that variant's interpreter")
        elif total == 0:
            failures.append(f"{who} never called `{name}` (0 calls in {_n(len(probes.processes), 'process')})")
        elif idle := [n for n in nodes if not _calls_on(probes, name, n)]:
            # the path under test must run on every node of a deployment, not on one of them
            failures.append(f"{who} never called `{name}` on node {idle[0]} ({_n(total, 'call')} on the other nodes); "
                            f"node {idle[0]}'s processes did not run the path under test")
        else:
            evidence.append(f"called `{short(name)}` {_n(total, 'time')}" + (f", on all {len(nodes)} nodes" if nodes else ""))
    for name in expect.not_called:
        total = probes.total_calls(name)
        if total:
            failures.append(f"{who} called `{name}` {_n(total, 'time')}; it was expected not to")
        else:
            evidence.append(f"never called `{short(name)}`")

    for key, expected in expect.per_forward.items():
        hist, forwards = per_forward_counts(probes, key)
        wanted = expected if isinstance(expected, int) else expected.describe()
        label = key if collective_key(key) else f"`{key}`"
        if forwards == 0:
            failures.append(f"{who}: no forward pass was recorded, so {label} per forward pass ({wanted}) cannot be checked")
        elif not all(_holds(expected, v) for v in hist):
            odd = odd_pass_tokens(probes, key, [v for v in hist if not _holds(expected, v)])
            sizes = f" (the first such passes held {', '.join(map(str, odd))} tokens)" if odd else ""
            failures.append(f"{who} was expected to make {wanted} {label} call(s) in every forward pass; "
                            f"seen {_counts_text(hist, forwards)} forward passes{sizes}")
        else:
            evidence.append(f"{wanted} {label if collective_key(key) else short(key)} in each of {_n(forwards, 'forward pass')}")

    if expect.forward_tokens:
        ran = tokens_per_forward(builders)
        for key, wanted_range in expect.forward_tokens.items():
            passes = ran.get(key, 0)
            shape = bin_size(key) + (" (a single request decoding alone)" if key == "1" else "")
            if wanted_range.holds(passes):
                evidence.append(f"{_n(passes, 'forward pass')} of {shape}")
            else:
                failures.append(f"{who} was expected to run {wanted_range.describe()} forward passes of {shape}; it ran "
                                f"{passes} ({_n(sum(ran.values()), 'pass')} in all): the batch shape under test "
                                "did not run as declared")

    for key, expected in expect.switches.items():
        canonical = probes.canonical(key) or key
        values = [(p, p.switches.get(canonical, _MISSING)) for p in builders]
        wrong = [(p, v) for p, v in values if v is _MISSING or not same_value(expected, v)]
        if wrong:
            p, v = wrong[0]
            seen = (f"not read ({p.switch_errors.get(canonical, 'not recorded')})" if v is _MISSING else f"{v!r}")
            failures.append(f"{who}: the engine resolved `{key}` to {seen} in {p.label}; expected {expected!r}")
        else:
            evidence.append(f"{key} = {expected!r}")
    by_task = {task: check_tasks(who, {task: wanted}, counters) for task, wanted in expect.tasks.items()}
    task_failures = {task: found[0] for task, found in by_task.items()}
    return _side_check(variant, failures + [f for fs in task_failures.values() for f in fs],
                       evidence + [e for _, ev in by_task.values() for e in ev], task_failures=task_failures)


_MISSING = object()


def _calls_on(probes: VariantProbes, name: str, node: str) -> int:
    canonical = probes.canonical(name) or ""
    return sum(p.calls.get(canonical, 0) for p in probes.processes if p.node == node)


def node_ranks(probes: VariantProbes) -> dict[str, list[Any]]:
    """Each node's data-parallel ranks, from the processes that built the model there."""
    ranks: dict[str, set[Any]] = {}
    for p in probes.builders:
        if p.node is not None:
            ranks.setdefault(p.node, set())
            if p.dp_index is not None:
                ranks[p.node].add(p.dp_index)
    return {node: sorted(r, key=str) for node, r in sorted(ranks.items(), key=lambda kv: int(kv[0]))}


def check_nodes(who: str, expect: Expectations, probes: VariantProbes) -> tuple[list[str], list[str]]:
    """A deployment's nodes: every node evalpipe started built the model (else nothing shows
    what ran there), and the shape `expect.deployment` states."""
    failures: list[str] = []
    evidence: list[str] = []
    ranks = node_ranks(probes)
    started = probes.deployment_nodes
    if started is not None:
        absent = [str(n) for n in range(started) if str(n) not in ranks]
        for node in absent:
            roles = sorted({p.role for p in probes.processes if p.node == node})
            seen = f"its processes ({', '.join(roles)}) built none" if roles else "no process of it wrote a record"
            failures.append(f"{who}: node {node} of its {started}-node deployment shows no model built there ({seen}), "
                            "so nothing shows which code ran on that node")
    shape = expect.deployment
    if shape is None:
        if ranks and not failures:
            evidence.append(f"model built on {_n(len(ranks), 'node')}")
        return failures, evidence
    if shape.nodes is not None and len(ranks) != shape.nodes:
        failures.append(f"{who} was expected to build its model on {_n(shape.nodes, 'node')}; its processes did on "
                        f"{len(ranks)} ({', '.join(f'node {n}' for n in ranks) or 'none recorded its node'})")
    for node, found in ranks.items():
        want = shape.ranks_of(int(node))
        if want is not None and len(found) != want:
            failures.append(f"{who}: node {node} was expected to run {_n(want, 'data-parallel rank')}; its processes "
                            f"served {len(found)} ({', '.join(map(str, found)) or 'none read'})")
    if shape.data_parallel_size is not None:
        wrong = [p for p in probes.builders if p.switches.get("data_parallel_size") != shape.data_parallel_size]
        if wrong:
            p = wrong[0]
            failures.append(f"{who}: {p.label} resolved data_parallel_size to {p.switches.get('data_parallel_size', 'nothing')!r}; "
                            f"expected {shape.data_parallel_size}")
    if not failures:
        evidence.append("nodes × data-parallel ranks: " + "; ".join(f"node {n}: {', '.join(map(str, r)) or '?'}"
                                                                  for n, r in ranks.items()))
    return failures, evidence


# ---------------------------------------------------------------------------
# what code ran
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PathProfile:
    """What code a variant ran, as far as its probes see: two variants with the same
    profile and IDENTICAL outputs compared a path with itself."""

    model_classes: frozenset[str]
    layer_classes: frozenset[str]
    called: frozenset[str]
    collectives: frozenset[tuple[str, tuple[str, ...]]]  # (kind, counts per forward seen)

    def to_dict(self) -> dict[str, Any]:
        return {"model_classes": sorted(self.model_classes), "layer_classes": sorted(self.layer_classes),
                "called": sorted(self.called), "collectives": {k: list(v) for k, v in sorted(self.collectives)}}


def profile(probes: VariantProbes) -> PathProfile:
    mains = [p.models[0] for p in probes.builders]
    kinds = sorted({k for m in mains for k in m.per_forward if collective_key(k)})
    return PathProfile(
        model_classes=frozenset(m.model_class for m in mains),
        layer_classes=frozenset(c for m in mains for c in m.layers),
        called=frozenset(n for p in probes.processes for n, c in p.calls.items() if c),
        collectives=frozenset((k, tuple(sorted(per_forward_counts(probes, k)[0]))) for k in kinds),
    )


# ---------------------------------------------------------------------------
# a comparison's two sides
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PathSide:
    """A side as judged: its expectations, records and check (None: the run predates probes)."""

    variant: str
    expect: Expectations | None
    probes: VariantProbes | None
    counters: Mapping[str, EngineCounters] | None = None  # task -> vLLM's counters over it (the manifest's)


SAME_CODE_REASON = ("the variants ran the same code: nothing was compared (same model and layer classes, functions "
                    "called and collectives per forward pass, same settings resolved by the engine, IDENTICAL "
                    "outputs, and no expectation tells `{a}` and "
                    "`{b}` apart); declare what each path must show under `expect:`, or `expect: {{same_path: true}}` "
                    "for a pair meant to be an A/A")


def resolved_settings(probes: VariantProbes) -> dict[str, tuple[str, ...]]:
    """Each switch the engine resolved (``max_num_seqs``, ``dtype``, a vllm_config path ...)
    -> its distinct values over the processes that built a model, as JSON texts."""
    seen: dict[str, set[str]] = {}
    for p in probes.builders:
        for key, value in p.switches.items():
            seen.setdefault(key, set()).add(json.dumps(value, sort_keys=True))
    return {k: tuple(sorted(v)) for k, v in sorted(seen.items())}


def settings_differences(a: VariantProbes, b: VariantProbes) -> list[str]:
    """``name a -> b`` for each switch the two sides' engines resolved differently."""
    sa, sb = resolved_settings(a), resolved_settings(b)
    missing = ("not recorded",)
    return [f"{key} {', '.join(sa.get(key, missing))} → {', '.join(sb.get(key, missing))}"
            for key in sorted(set(sa) | set(sb)) if sa.get(key) != sb.get(key)]


def _path_differences(reference: VariantProbes, variant: VariantProbes) -> list[str]:
    """What tells two sides' code apart whatever their batches were: the model and layer
    classes, and which of the configured names were called (counts per forward pass
    depend on the batches, which an A/A run rearranges on purpose)."""
    a, b = profile(reference), profile(variant)
    configured = {c for probes in (reference, variant) for c in probes.names.values() if c}
    out = []
    for label, x, y in (("model classes", a.model_classes, b.model_classes),
                        ("decoder layer classes", a.layer_classes, b.layer_classes),
                        ("configured functions called", a.called & configured, b.called & configured)):
        if x != y:
            out.append(f"{label} {', '.join(f'`{n}`' for n in sorted(y)) or 'none'} (the reference: "
                       f"{', '.join(f'`{n}`' for n in sorted(x)) or 'none'})")
    return out


def judge_paths(reference: PathSide, variant: PathSide, outputs_identical: bool) -> Paths:
    """What ran on each side (:func:`summarize`, of the names their expectations probe), judged."""
    sides = (reference, variant)
    names = profile_names(sides)
    what_ran = WhatRan(a=summarize(reference.probes, names), b=summarize(variant.probes, names))

    def judged(status: PathStatus, reasons: Sequence[str], checks: Sequence[SideCheck] = (), same: bool | None = None) -> Paths:
        return Paths(status=status, reasons=tuple(reasons), checks=tuple(checks), same_profile=same, what_ran=what_ran)

    if any(s.probes is None for s in sides):
        missing = [s.variant for s in sides if s.probes is None]
        return judged(NOT_RECORDED, (f"path not verified: {', '.join(f'`{m}`' for m in missing)} ran before "
                                     "evalpipe recorded path probes",))
    checks = tuple(check_side(s.variant, s.expect or Expectations(), s.probes, s.counters)  # type: ignore[arg-type]
                   for s in sides)
    failures = tuple(f for c in checks for f in c.failures)
    if failures:
        return judged(FAILED, failures, checks)
    ref_probes, var_probes = reference.probes, variant.probes
    assert ref_probes is not None and var_probes is not None  # narrowed above
    same = profile(ref_probes) == profile(var_probes)
    claims_differ = (reference.expect or Expectations()).claims() != (variant.expect or Expectations()).claims()
    meant_same = variant.expect is not None and variant.expect.same_path
    # a variant claiming the reference's own path must show it; one with claims of its own is
    # held to those (a night whose variant holds another build's path claims that path)
    if meant_same and not claims_differ and (differs := _path_differences(ref_probes, var_probes)):
        return judged(FAILED, (f"variant `{variant.variant}` was declared to run the reference's code "
                               f"(same_path) but ran other code than `{reference.variant}`: {'; '.join(differs)}",),
                      checks, same)
    # the same code with other resolved settings (max_num_seqs 7 against 64) is an A/B of those settings
    settings = settings_differences(ref_probes, var_probes)
    if same and outputs_identical and not claims_differ and not meant_same and not settings:
        return judged(SAME_CODE, (SAME_CODE_REASON.format(a=reference.variant, b=variant.variant),), checks, same)
    evidence = tuple(f"{c.variant}: {'; '.join(c.evidence)}" for c in checks if c.evidence)
    if settings and not meant_same:
        evidence += (f"the engines resolved different settings: {'; '.join(settings)}",)
    return judged(VERIFIED, evidence, checks, same)


def summarize(probes: VariantProbes | None, names: Sequence[str] = ()) -> ProbeSummary | None:
    """The "what ran" of one variant for reports and the history: processes by role, model
    and layer classes, the switches (one value, or each process's where they differ), calls
    of the probed ``names``, and per collective kind how many forward passes saw how many calls."""
    if probes is None:
        return None
    roles: dict[str, int] = {}
    for p in probes.processes:
        roles[p.role] = roles.get(p.role, 0) + 1
    builders = probes.builders
    seen: dict[str, dict[str, Any]] = {}  # name -> {JSON text: value}: the distinct values over processes
    for p in builders:
        for key, value in p.switches.items():
            seen.setdefault(key, {})[json.dumps(value, sort_keys=True)] = value
    layer_counts: dict[str, int] = {}
    for p in builders:
        for cls, n in p.models[0].layers.items():
            layer_counts[cls] = layer_counts.get(cls, 0) + n
    kinds = sorted({k for p in builders for k in p.models[0].per_forward if collective_key(k) and "@" not in k})
    per_forward = {}
    for kind in kinds:
        hist, forwards = per_forward_counts(probes, kind)
        per_forward[kind] = CollectiveCounts(counts=hist, forwards=forwards)
    return ProbeSummary(
        mode=probes.mode,
        verifiable=probes.verifiable,
        processes=roles,
        models=sorted({p.models[0].model_class for p in builders}),
        layers=layer_counts,
        # one value when every process resolved the same, else each process's (ranks differ by rank)
        switches={k: next(iter(v.values())) if len(v) == 1 else {"per_process": [v[t] for t in sorted(v)]}
                  for k, v in sorted(seen.items())},
        calls={n: probes.total_calls(n) for n in names},
        absent=sorted(n for n in names if probes.canonical(n) is None),
        collectives_per_forward=per_forward,
        forwards=sum(p.models[0].forwards for p in builders),
        tokens_per_forward=tokens_per_forward(builders),
        server_of=probes.server_of,
        nodes=node_ranks(probes),
    )


def tokens_per_forward(builders: Sequence[ProcessProbe]) -> dict[str, int]:
    """The model's forward passes by their tokens (power-of-two bins, least first), summed over
    the processes that built it: each tensor-parallel rank counts the passes it ran."""
    total: dict[str, int] = {}
    for p in builders:
        for key, n in p.models[0].tokens_per_forward.items():
            total[key] = total.get(key, 0) + n
    return dict(sorted(total.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0)))


def profile_names(sides: Iterable[PathSide]) -> list[str]:
    """The probed names worth a row in the what-ran table: those any side's expectations name."""
    out: list[str] = []
    for s in sides:
        if s.expect is not None:
            out += s.expect.probed_names()
    return [n for n in dict.fromkeys(out) if "(" not in n and "_config" not in n.split(".", 1)[0]]

