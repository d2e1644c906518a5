"""Judging a recorded night: tonight's variants against each other (the run's verdict),
tonight against the baseline night per variant (the paired comparison of `evalpipe
compare`, tonight's A/A run as the noise floor), and the series over the history
(:mod:`evalpipe.compare.changepoint`), with the bisect hint for a flagged change. The
night's statuses and what each means: :mod:`evalpipe.nightly.night`."""


from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from evalpipe.compare.changepoint import Change, score_changes, token_changes
from evalpipe.compare.run import check_same_items, compare_artifacts
from evalpipe.config.expectations import Expectations
from evalpipe.documents.base import as_written
from evalpipe.documents.comparison import PASSING, Comparison, Paths, Status, TokenSummary, read_comparison
from evalpipe.documents.history_rows import RecordedRun, RecordedVariant, ScorePoint
from evalpipe.documents.nightly_doc import (
    BaselineComparison,
    ComponentChange,
    FlippedNightItem,
    NightlyDocument,
    NightStatus,
    PathsBrief,
    SeriesChange,
    TokenBrief,
)
from evalpipe.documents.run_doc import RunStatus
from evalpipe.documents.worker_job import JOB_JSON, read_job
from evalpipe.errors import UserError
from evalpipe.gates import registry
from evalpipe.history.store import History
from evalpipe.pipeline.comparing import load_artifacts, load_teacher, read_run_info, variant_numerics
from evalpipe.report.view import flatten
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import RUN_JSON

# token measures followed per task, (source, measure), each with the gate that judges it
# within a night (its threshold is the series' floor): the registry's gates that have one
TOKEN_GATES = {g.series: g.name for g in registry.GATES if g.series is not None}
TOKEN_SERIES = tuple(TOKEN_GATES)


class _Findings:
    """What makes a night worse than PASS, in the order found; the worst status stands."""

    def __init__(self) -> None:
        self.status: NightStatus = NightStatus.PASS
        self.reasons: list[str] = []

    def fail(self, reason: str, status: NightStatus = NightStatus.REGRESSION) -> None:
        if status.severity > self.status.severity:
            self.status = status
        self.reasons.append(reason)


# ---------------------------------------------------------------------------
# baselines and the bisect hint
# ---------------------------------------------------------------------------


def baseline_of(history: History, variant: str, nights: list[RecordedRun], tonight: str | None = None) -> str | None:
    """The night ``variant`` is judged against: the pinned baseline, else the last night
    of the series that passed (before ``tonight``, when tonight is already recorded).
    One rule for both uses: the teacher pass before the run, the judgement after it."""
    pinned = history.pinned_baseline(variant)
    if pinned is not None:
        return pinned
    if tonight is not None:
        started = history.run(tonight).started_at
        nights = [n for n in nights if n.run_id != tonight and n.started_at <= started]
    passing = [n for n in nights if n.passed_as_baseline]
    return passing[-1].run_id if passing else None


def nothing_compared(reference: str | None) -> str:
    """Why a night that compared nothing is not a pass."""
    return (f"tonight compared nothing: the variant selection leaves no variant to compare with the reference "
            f"`{reference}` and no earlier night to compare it with, so nothing is proven; select two variants or more "
            "(nightly.variants or --variants), or pin a baseline night (`evalpipe baseline set RUN_ID`)")


def _flat(d: Any) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in flatten(d).items()}


def bisect_hint(history: History, last_good: str | None, first_bad: str, variant: str) -> list[ComponentChange]:
    """What changed for ``variant`` between two nights: components, then settings."""
    if last_good is None:
        return []

    def of(run_id: str) -> RecordedVariant:
        return next((v for v in history.variants_of(run_id) if v.name == variant), RecordedVariant(name=variant, role="variant"))

    a, b = of(last_good), of(first_bad)
    out = []
    for kind, fa, fb in (("", _flat(a.components), _flat(b.components)), ("settings.", _flat(a.settings), _flat(b.settings))):
        for name in sorted(set(fa) | set(fb)):
            if fa.get(name) != fb.get(name):
                out.append(ComponentChange(component=f"{kind}{name}", before=fa.get(name), after=fb.get(name)))
    return out


# ---------------------------------------------------------------------------
# tonight against the baseline
# ---------------------------------------------------------------------------


def meant_same(expect: Expectations | None) -> Expectations:
    """Side B of a comparison meant to run the same code as side A (the same variant on two
    nights, a reference against its own A/A run): its recorded expectations with
    ``same_path``, so IDENTICAL outputs of the same path pass instead of being judged
    "same_code". Each side is still checked against its own expectations."""
    return (expect or Expectations()).model_copy(update={"same_path": True})


def tonight_floor(tonight_dir: Path) -> tuple[Any, Any]:
    """(gates, A/A comparison) of tonight's run: its reference against its own A/A run is
    the engine's noise between two runs, the floor of every drift from the baseline."""
    info = read_run_info(tonight_dir)
    where = str(tonight_dir / RUN_JSON)
    gates = info.gates_of(where)
    aa_name, ref = info.aa_variant, info.reference
    if not (aa_name and ref and (tonight_dir / aa_name).is_dir()):
        return gates, None
    ref_dir = artifacts.VariantDir(tonight_dir / ref)
    ref_side = load_artifacts(ref_dir, expect=info.expectations_of(ref, where))
    aa_side = load_artifacts(artifacts.VariantDir(tonight_dir / aa_name),
                             expect=meant_same(info.expectations_of(aa_name, where)))
    aa = compare_artifacts(ref_side, aa_side, worst_k=3, gates=gates, numerics=variant_numerics(ref_dir))
    return gates, aa


def vs_baseline(base_dir: Path, tonight_dir: Path, variant: str, baseline: str,
                floor: tuple[Any, Any] | None = None) -> BaselineComparison:
    """One variant tonight against itself on the baseline night ``baseline``, as compare.json's
    comparison entry in brief (or why the two cannot be compared). ``floor``:
    :func:`tonight_floor`, computed once per night by the caller."""
    base_v, night_v = base_dir / variant, tonight_dir / variant
    label_a, label_b = f"{base_dir.name}/{variant}", f"{tonight_dir.name}/{variant}"
    try:
        base_info = read_run_info(base_dir)
        # each night judged by the expectations its own run recorded; tonight meant to run
        # the baseline's path (see meant_same)
        a = load_artifacts(artifacts.VariantDir(base_v), label_a,
                           base_info.expectations_of(variant, str(base_dir / RUN_JSON)))
        b = load_artifacts(artifacts.VariantDir(night_v), label_b,
                           meant_same(read_run_info(tonight_dir).expectations_of(variant, str(tonight_dir / RUN_JSON))))
        check_same_items(a.samples, b.samples, label_a, label_b)
    except UserError as err:
        return BaselineComparison(variant=variant, baseline=baseline, error=str(err))
    # Teacher forcing across nights is clean only on the same forced tokens: the baseline
    # scored its reference's sequences (teacher.parquet), tonight scored the same ones
    # (teacher_baseline.parquet). Without that pair the comparison is free-running only.
    forced = _baseline_forcing(artifacts.VariantDir(night_v), base_dir / (base_info.reference or ""))
    a, b = dataclasses.replace(a, teacher=a.teacher if forced is not None else None), dataclasses.replace(b, teacher=forced)
    gates, aa = floor if floor is not None else tonight_floor(tonight_dir)
    vc = compare_artifacts(a, b, worst_k=3, gates=gates, aa=aa, numerics=variant_numerics(artifacts.VariantDir(base_v)))
    d = as_written(vc.doc)  # the measures as the file would hold them (no NaN, no infinity)
    return BaselineComparison(
        variant=variant, baseline=baseline, status=d.status, teacher_forced=forced is not None, reasons=list(d.reasons),
        outputs_status=d.outputs_status, paths=_paths_brief(d.paths), scores=list(d.scores),
        tokens=[_token_brief(t) for t in d.tokens], teacher=[_token_brief(t) for t in d.teacher or []])


def _paths_brief(paths: Paths | None) -> PathsBrief | None:
    if paths is None:
        return None
    return PathsBrief(status=paths.status, reasons=list(paths.reasons))


def _first_reason(comparison: Comparison) -> str:
    """The first reason a compare.json comparison's paths give, else its verdict's first reason."""
    reasons = (comparison.paths.reasons if comparison.paths else []) or comparison.reasons
    return str(reasons[0]) if reasons else "no reason was recorded"


def tonight_inconclusive(run_dir: Path, verdict: str | None) -> str | None:
    """Why tonight's own comparison proves nothing about the paths (from its compare.json),
    None when every comparison proves something."""
    path = artifacts.RunDir(run_dir).compare_json
    comparisons = read_comparison(path).comparisons if path.is_file() else []
    inconclusive = [c for c in comparisons if c.status is Status.INCONCLUSIVE]
    if not inconclusive:
        if verdict != Status.INCONCLUSIVE:
            return None
        return (f"tonight's comparison proves nothing about the paths, and {path} is missing to say why; "
                f"`evalpipe compare {run_dir}` writes it again")
    text = f"tonight's comparison proves nothing about the paths: {_first_reason(inconclusive[0])}"
    others = [f"`{c.variant}`" for c in inconclusive[1:]]
    return text + (f" (also inconclusive: {', '.join(others)})" if others else "")


def _baseline_forcing(vdir: artifacts.VariantDir, baseline_reference: Path) -> Any:
    """Tonight's teacher_baseline.parquet when it holds ``baseline_reference``'s sequences, else None."""
    job_path = vdir.root / JOB_JSON
    if not vdir.teacher_baseline.is_file() or not job_path.is_file():
        return None
    source = read_job(job_path).teacher.baseline_dir or ""
    if not source or Path(source).resolve() != baseline_reference.resolve():
        return None
    return load_teacher(vdir, vdir.teacher_baseline)


def _token_brief(t: TokenSummary) -> TokenBrief:
    return TokenBrief.model_validate(t.model_dump(include=set(TokenBrief.model_fields)))


# ---------------------------------------------------------------------------
# the series
# ---------------------------------------------------------------------------


def night_label(started_at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at))


def series_changes(history: History, nights: list[RecordedRun], *, alpha: float, min_nights: int) -> list[SeriesChange]:
    """Every change the detector finds over ``nights`` (oldest first), scores and tokens."""
    ids = [n.run_id for n in nights]
    pos = {r: i for i, r in enumerate(ids)}
    rows = history.score_rows(ids, with_items=True)
    by_key: dict[tuple[str, str, str], list[ScorePoint]] = {}
    aa_items: dict[tuple[str, str, str], ScorePoint] = {}
    for r in rows:
        if r.role == "aa":
            aa_items[(r.run_id, r.task, r.metric)] = r
            continue
        by_key.setdefault((r.task, r.metric, r.variant), []).append(r)
    ref_items = {(r.run_id, r.task, r.metric): r for r in rows if r.role == "reference"}
    out = []
    for (task, metric, variant), series in sorted(by_key.items()):
        latest = series[-1].item_set_pk
        same = [r for r in series if r.item_set_pk == latest]  # the paired stretch
        if len(same) < 2:
            continue
        matrix = np.vstack([r.items for r in same])
        discordant = [
            float(np.sum(ref_items[k].items != aa_items[k].items))
            for r in same
            if (k := (r.run_id, task, metric)) in aa_items and k in ref_items
            and aa_items[k].item_set_pk == ref_items[k].item_set_pk == latest
        ]
        aa_disc = float(np.median(discordant)) if discordant else None
        for c in score_changes(matrix, aa_disc, alpha=alpha, min_nights=min_nights):
            first, last = same[c.index], same[c.last_good]
            keys = history.item_keys(latest)
            flipped = [FlippedNightItem(doc_id=keys[i][0], repeat=keys[i][1], before=b, after=a) for i, b, a in c.flipped]
            out.append(_series_change(history, c, "score", task, metric, variant, first.run_id, last.run_id,
                                      nights[pos[first.run_id]], flipped))
    tok = history.token_rows(ids)
    tseries: dict[tuple[str, str, str, str], dict[str, float | None]] = {}
    for t in tok:
        for source, measure in TOKEN_SERIES:
            if t.source != source:
                continue
            role = "aa" if t.role == "aa" else t.variant
            tseries.setdefault((t.task, source, measure, role), {})[t.run_id] = t.measure(measure)
    thresholds = {(g.run_id, g.variant, g.task, g.gate): g.threshold for g in history.gate_rows(ids)}
    for (task, source, measure, role), values in sorted(tseries.items()):
        if role == "aa":
            continue
        aa = tseries.get((task, source, measure, "aa"), {})
        gate = TOKEN_GATES[(source, measure)]
        v = np.array([np.nan if values.get(i) is None else values[i] for i in ids], dtype=np.float64)
        a = np.array([np.nan if aa.get(i) is None else aa[i] for i in ids], dtype=np.float64)
        floor = np.array([np.nan if thresholds.get((i, role, task, gate)) is None else thresholds[(i, role, task, gate)] for i in ids])
        for c in token_changes(v, a, floor, min_nights=min_nights):
            out.append(_series_change(history, c, "token", task, f"{source}_{measure}", role, ids[c.index], ids[c.last_good],
                                      nights[c.index], []))
    return out


def _series_change(history: History, c: Change, kind: Literal["score", "token"], task: str, metric: str, variant: str,
                   first_bad: str, last_good: str, night: RecordedRun, flipped: list[FlippedNightItem]) -> SeriesChange:
    regression = (c.direction == "down") if kind == "score" else (c.direction == "up")
    scale = 100 if kind == "score" else 1
    unit = " points" if kind == "score" else ""
    word = {"flagged": "changed", "pending": "moved (pending: not yet lasting)", "not significant": "moved (not significant)"}[c.state]
    summary = (f"{task} {metric} of {variant} {word} at {first_bad}: {c.before:.4g} → {c.after:.4g} "
               f"({(c.delta) * scale:+.3g}{unit}"
               + (f", paired p {c.p_value:.2g}" if c.p_value is not None else "")
               + f", {c.nights_after} night{'s' if c.nights_after != 1 else ''} so far" * c.open
               + (f", lasted {c.nights_after} night{'s' if c.nights_after != 1 else ''}" if not c.open else "") + ")")
    return SeriesChange(
        kind=kind, task=task, metric=metric, variant=variant, run_id=first_bad, night=night_label(night.started_at),
        direction=c.direction, before=c.before, after=c.after, delta=c.delta, p_value=c.p_value,
        nights_after=c.nights_after, open=c.open, state=c.state, regression=regression,
        summary=summary, flipped=flipped, bisect=bisect_hint(history, last_good, first_bad, variant),
        last_good=last_good, first_bad=first_bad)


# ---------------------------------------------------------------------------
# judging a recorded night
# ---------------------------------------------------------------------------


def _with_prompts(change: SeriesChange, vdir: Path, keep: int = 300) -> SeriesChange:
    """The change with the end of each flipped item's prompt (where the question is), from
    the first bad night's samples, when its run directory is still there."""
    path = artifacts.VariantDir(vdir).samples
    if not path.is_file():
        return change
    cols = artifacts.read_table(path).select(["task", "doc_id", "repeat", "prompt"]).to_pydict()
    prompts = {(t, int(d), int(r)): p for t, d, r, p in zip(cols["task"], cols["doc_id"], cols["repeat"], cols["prompt"])}

    def ending(text: str | None) -> str | None:
        return None if text is None else ("…" + text[-keep:] if len(text) > keep else text)

    flipped = [f.model_copy(update={"prompt": ending(prompts.get((change.task, f.doc_id, f.repeat)))}) for f in change.flipped]
    return change.model_copy(update={"flipped": flipped})


def series_nights(history: History, run_id: str) -> list[RecordedRun]:
    """The nights of the same config up to and including ``run_id``, oldest first."""
    tonight = history.run(run_id)
    return [n for n in history.runs(kind="nightly", config_hash=tonight.config_hash) if n.started_at <= tonight.started_at]


def judge(history: History, run_id: str, *, alpha: float = 1e-3, min_nights: int = 2) -> NightlyDocument:
    """Judge a night already in the history; stores the result and returns it."""
    tonight = history.run(run_id)
    found = _Findings()
    tonight_dir = Path(tonight.run_dir)
    paths: str | None = None
    if tonight.status is not RunStatus.OK:
        found.fail(f"tonight's run {run_id} did not finish ({tonight.status})", NightStatus.FAILED)
    else:
        if tonight.verdict is not None and tonight.verdict not in (*PASSING, Status.INCONCLUSIVE):
            found.fail(f"tonight's variants differ from the reference {tonight.reference}: {tonight.verdict}")
        paths = tonight_inconclusive(tonight_dir, tonight.verdict)
        if paths:
            found.fail(paths, NightStatus.INCONCLUSIVE)
    nights = series_nights(history, run_id)
    floor = None
    baseline: str | None = None
    against: list[BaselineComparison] = []
    for v in history.variants_of(run_id):
        if v.role == "aa":
            continue
        base = baseline_of(history, v.name, nights, tonight=run_id)
        if base is None or base == run_id:
            continue
        baseline = baseline or base
        base_dir = Path(history.run(base).run_dir)
        if not (base_dir / v.name).is_dir():
            against.append(BaselineComparison(variant=v.name, baseline=base,
                                              error=f"the baseline's run directory {base_dir} has no {v.name} (moved or deleted)"))
            continue
        if floor is None:
            floor = tonight_floor(tonight_dir)
        entry = vs_baseline(base_dir, tonight_dir, v.name, base, floor)
        against.append(entry)
        if entry.error is not None:
            found.fail(f"{v.name} cannot be compared with baseline {base}: {entry.error}")
        elif entry.status is Status.INCONCLUSIVE:
            found.fail(f"{v.name}'s comparison with baseline {base} proves nothing about the paths: {entry.first_path_reason}",
                       NightStatus.INCONCLUSIVE)
        elif entry.status not in PASSING:
            first = entry.reasons[0] if entry.reasons else ""
            found.fail(f"{v.name} drifted from baseline {base}: {entry.status} ({first})")
    compared = True
    if tonight.status is RunStatus.OK and tonight.verdict is None and all(e.error is not None for e in against):
        compared = False
        found.fail(nothing_compared(tonight.reference), NightStatus.INCONCLUSIVE)
    changes = [_with_prompts(c, Path(history.run(c.first_bad).run_dir) / c.variant) if c.state == "flagged" and c.flipped else c
               for c in series_changes(history, nights, alpha=alpha, min_nights=min_nights)]
    for c in changes:
        if c.state == "flagged" and c.open and c.regression:
            hint = ", ".join(f"{b.component} {b.before} → {b.after}" for b in c.bisect[:3]) or "no component changed"
            found.fail(f"{c.summary}; changed between {c.last_good} and {c.first_bad}: {hint}")
    night = NightlyDocument(run_id=run_id, status=found.status, verdict=tonight.verdict, baseline=baseline,
                            reasons=found.reasons, vs_baseline=against, changes=changes, paths=paths, compared=compared)
    history.set_judgement(night)
    return night
