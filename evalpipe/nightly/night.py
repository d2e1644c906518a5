"""`evalpipe nightly`: run tonight's matrix, record it, and judge three things.

1. Tonight's variants against each other: the run's own verdict.
2. Tonight against the baseline night, per variant, on the same items: the paired
   comparison of `evalpipe compare` (flips, McNemar, TOST at the margin, token drift),
   with tonight's A/A run as the noise floor of the token gates.
3. The series: every task x metric x variant over the nightly history
   (:mod:`evalpipe.compare.changepoint`), and the token measures of every variant.

The night is a REGRESSION when (1) fails, when a variant drifted from its baseline
(2), or when a series has a flagged change that lasts until tonight (a score going
down, a token measure going up). It is INCONCLUSIVE when nothing else failed but (1) or
a variant's (2) proves nothing about the code paths (a variant did not run the path its
config declares, or cannot be verified): a night that silently ran another path must
not pass; and when it compared nothing at all (one variant, no baseline night yet). Such
a night, with no other reason, may still be the baseline of the next. Its evidence goes to nightly.json / nightly.md /
nightly-junit.xml in the run directory, the history database and the dashboard; a
flagged change names the components that changed between the last good night and
the first bad one (the bisect hint).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evalpipe.compare.changepoint import Change, score_changes, token_changes
from evalpipe.compare.run import check_same_items, compare_artifacts
from evalpipe.compare.verdict import PASSING as PASSING_STATUSES
from evalpipe.compare.verdict import Status
from evalpipe.config.run_config import Expectations, load_config
from evalpipe.documents.comparison import Comparison, Paths, TokenSummary, read_comparison
from evalpipe.documents.nightly_doc import NIGHTLY_JSON, NightlyDocument, write_nightly_document
from evalpipe.documents.worker_job import JOB_JSON, read_job
from evalpipe.errors import ExitCode, RunFailed, UserError
from evalpipe.gates import registry
from evalpipe.history import HistoryError
from evalpipe.history.store import History, open_history
from evalpipe.install import config_label
from evalpipe.pipeline.comparing import load_artifacts, load_teacher, read_run_info, variant_numerics
from evalpipe.pipeline.plan import make_plan
from evalpipe.pipeline.runner import execute
from evalpipe.report.dashboard import render_dashboard
from evalpipe.report.nightly import render_night_junit, render_night_summary
from evalpipe.report.view import flatten
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import REPORT_HTML, RUN_JSON

NIGHTLY_MD = "nightly.md"
NIGHTLY_JUNIT = "nightly-junit.xml"
PASSING = tuple(s.value for s in PASSING_STATUSES)  # the comparison statuses a night passes with
INCONCLUSIVE = Status.INCONCLUSIVE.value
# A night's statuses, least severe first: a finding (REGRESSION) outranks a night that
# proved nothing about its paths, and a run that did not finish outranks both.
NIGHT_STATUSES = ("PASS", INCONCLUSIVE, "REGRESSION", "FAILED")
EXIT_CODES = {"PASS": ExitCode.OK, "REGRESSION": ExitCode.DIVERGENT, "FAILED": ExitCode.FAILED, INCONCLUSIVE: ExitCode.INCONCLUSIVE}
NIGHT_COLOURS = {"PASS": "green", INCONCLUSIVE: "yellow", "REGRESSION": "red", "FAILED": "red"}
# token measures followed per task, (source, measure), each with the gate that judges it
# within a night (its threshold is the series' floor): the registry's gates that have one
TOKEN_GATES = {g.series: g.name for g in registry.GATES if g.series is not None}
TOKEN_SERIES = tuple(TOKEN_GATES)


@dataclass
class Judgement:
    run_id: str
    status: str = "PASS"  # one of NIGHT_STATUSES
    verdict: str | None = None
    baseline: str | None = None
    reasons: list[str] = field(default_factory=list)
    vs_baseline: list[dict[str, Any]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    paths: str | None = None  # why tonight's own comparison proves nothing about the paths
    compared: bool = True  # False: neither tonight's variants nor a baseline night gave anything to compare

    def fail(self, reason: str, status: str = "REGRESSION") -> None:
        if NIGHT_STATUSES.index(status) > NIGHT_STATUSES.index(self.status):
            self.status = status
        self.reasons.append(reason)

    def to_document(self) -> NightlyDocument:
        return NightlyDocument(**self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The judgement as the history stores it (nightly.json's fields but its version)."""
        return {
            "run_id": self.run_id, "status": self.status, "verdict": self.verdict, "baseline": self.baseline,
            "reasons": self.reasons, "vs_baseline": self.vs_baseline, "changes": self.changes, "paths": self.paths,
            "compared": self.compared,
        }


# ---------------------------------------------------------------------------
# baselines and the bisect hint
# ---------------------------------------------------------------------------


def baseline_of(history: History, variant: str, nights: list[dict[str, Any]], tonight: str | None = None) -> str | None:
    """The night ``variant`` is judged against: the pinned baseline, else the last night
    of the series that passed (before ``tonight``, when tonight is already recorded).
    One rule for both uses: the teacher pass before the run, the judgement after it."""
    pinned = history.pinned_baseline(variant)
    if pinned is not None:
        return pinned
    if tonight is not None:
        started = history.run(tonight)["started_at"]
        nights = [n for n in nights if n["run_id"] != tonight and n["started_at"] <= started]
    passing = [n for n in nights if n.get("nightly_status") == "PASS" or _only_compared_nothing(n)]
    return passing[-1]["run_id"] if passing else None


def _only_compared_nothing(night: dict[str, Any]) -> bool:
    """A night INCONCLUSIVE for the one reason that it had nothing to compare (the first night
    of a one-variant series): it proves nothing, but it showed no fault either, so the next
    night may be judged against it."""
    judgement = night.get("judgement") or {}
    return (night.get("nightly_status") == INCONCLUSIVE and judgement.get("compared") is False
            and len(judgement.get("reasons") or []) == 1)


def nothing_compared(reference: str | None) -> str:
    """Why a night that compared nothing is not a pass."""
    return (f"tonight compared nothing: the variant selection leaves no variant to compare with the reference "
            f"`{reference}` and no earlier night to compare it with, so nothing is proven; select two variants or more "
            "(nightly.variants or --variants), or pin a baseline night (`evalpipe baseline set RUN_ID`)")


def _flat(d: Any) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in flatten(d).items()}


def bisect_hint(history: History, last_good: str | None, first_bad: str, variant: str) -> list[dict[str, Any]]:
    """What changed for ``variant`` between two nights: components, then settings."""
    if last_good is None:
        return []
    def of(run_id: str) -> dict[str, Any]:
        return next((v for v in history.variants_of(run_id) if v["name"] == variant), {})
    a, b = of(last_good), of(first_bad)
    out = []
    for kind, key in (("", "components"), ("settings.", "settings")):
        fa, fb = _flat(a.get(key) or {}), _flat(b.get(key) or {})
        for name in sorted(set(fa) | set(fb)):
            if fa.get(name) != fb.get(name):
                out.append({"component": f"{kind}{name}", "before": fa.get(name), "after": fb.get(name)})
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


def vs_baseline(base_dir: Path, tonight_dir: Path, variant: str, floor: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """One variant tonight against itself on the baseline night, as compare.json's
    comparison entry (plus "error" when the two cannot be compared). ``floor``:
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
        return {"variant": variant, "error": str(err)}
    # Teacher forcing across nights is clean only on the same forced tokens: the baseline
    # scored its reference's sequences (teacher.parquet), tonight scored the same ones
    # (teacher_baseline.parquet). Without that pair the comparison is free-running only.
    forced = _baseline_forcing(artifacts.VariantDir(night_v), base_dir / (base_info.reference or ""))
    a, b = dataclasses.replace(a, teacher=a.teacher if forced is not None else None), dataclasses.replace(b, teacher=forced)
    gates, aa = floor if floor is not None else tonight_floor(tonight_dir)
    vc = compare_artifacts(a, b, worst_k=3, gates=gates, aa=aa, numerics=variant_numerics(artifacts.VariantDir(base_v)))
    d = vc.document()
    return {"variant": variant, "status": d.status, "teacher_forced": forced is not None, "reasons": d.reasons,
            "outputs_status": d.outputs_status, "paths": _paths_brief(d.paths),
            "scores": [r.model_dump(mode="json") for r in d.scores], "tokens": [_token_brief(t) for t in d.tokens],
            "teacher": [_token_brief(t) for t in d.teacher or []]}


def _paths_brief(paths: Paths | None) -> dict[str, Any] | None:
    if paths is None:
        return None
    return {"status": paths.status, "reasons": list(paths.reasons)}


def first_path_reason(comparison: dict[str, Any]) -> str:
    """The first reason a comparison's paths give (a compare.json comparison or a
    vs_baseline entry); its verdict's first reason when it recorded no path reasons."""
    reasons = (comparison.get("paths") or {}).get("reasons") or comparison.get("reasons") or []
    return str(reasons[0]) if reasons else "no reason was recorded"


def _first_reason(comparison: Comparison) -> str:
    """first_path_reason of a compare.json comparison."""
    reasons = (comparison.paths.reasons if comparison.paths else []) or comparison.reasons
    return str(reasons[0]) if reasons else "no reason was recorded"


def tonight_inconclusive(run_dir: Path, verdict: str | None) -> str | None:
    """Why tonight's own comparison proves nothing about the paths (from its compare.json),
    None when every comparison proves something."""
    path = artifacts.RunDir(run_dir).compare_json
    comparisons = read_comparison(path).comparisons if path.is_file() else []
    inconclusive = [c for c in comparisons if c.status == INCONCLUSIVE]
    if not inconclusive:
        if verdict != INCONCLUSIVE:
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


def _token_brief(t: TokenSummary) -> dict[str, Any]:
    return t.model_dump(mode="json", include={"task", "n_samples", "n_divergent", "n_hard_divergences",
                                              "n_near_tie_divergences", "kl_p99", "kl_max", "identical"})


# ---------------------------------------------------------------------------
# the series
# ---------------------------------------------------------------------------


def _night_label(started_at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at))


def series_changes(history: History, nights: list[dict[str, Any]], *, alpha: float, min_nights: int) -> list[dict[str, Any]]:
    """Every change the detector finds over ``nights`` (oldest first), scores and tokens."""
    ids = [n["run_id"] for n in nights]
    pos = {r: i for i, r in enumerate(ids)}
    rows = history.score_rows(ids, with_items=True)
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    aa_items: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        if r["role"] == "aa":
            aa_items[(r["run_id"], r["task"], r["metric"])] = r
            continue
        by_key.setdefault((r["task"], r["metric"], r["variant"]), []).append(r)
    ref_items = {(r["run_id"], r["task"], r["metric"]): r for r in rows if r["role"] == "reference"}
    out = []
    for (task, metric, variant), series in sorted(by_key.items()):
        latest = series[-1]["item_set_pk"]
        same = [r for r in series if r["item_set_pk"] == latest]  # the paired stretch
        if len(same) < 2:
            continue
        matrix = np.vstack([r["values"] for r in same])
        discordant = [
            float(np.sum(ref_items[k]["values"] != aa_items[k]["values"]))
            for r in same
            if (k := (r["run_id"], task, metric)) in aa_items and k in ref_items
            and aa_items[k]["item_set_pk"] == ref_items[k]["item_set_pk"] == latest
        ]
        aa_disc = float(np.median(discordant)) if discordant else None
        for c in score_changes(matrix, aa_disc, alpha=alpha, min_nights=min_nights):
            first, last = same[c.index], same[c.last_good]
            keys = history.item_keys(latest)
            out.append(_change_dict(history, c, "score", task, metric, variant, first["run_id"], last["run_id"], nights[pos[first["run_id"]]],
                                    flipped=[{"doc_id": keys[i][0], "repeat": keys[i][1], "before": b, "after": a} for i, b, a in c.flipped]))
    tok = history.token_rows(ids)
    tseries: dict[tuple[str, str, str, str], dict[str, dict[str, Any]]] = {}
    for r in tok:
        for source, measure in TOKEN_SERIES:
            if r["source"] != source:
                continue
            role = "aa" if r["role"] == "aa" else r["variant"]
            tseries.setdefault((r["task"], source, measure, role), {})[r["run_id"]] = r[measure]
    thresholds = {(g["run_id"], g["variant"], g["task"], g["gate"]): g["threshold"] for g in history.gate_rows(ids)}
    for (task, source, measure, role), values in sorted(tseries.items()):
        if role == "aa":
            continue
        aa = tseries.get((task, source, measure, "aa"), {})
        gate = TOKEN_GATES[(source, measure)]
        v = np.array([np.nan if values.get(i) is None else values[i] for i in ids], dtype=np.float64)
        a = np.array([np.nan if aa.get(i) is None else aa[i] for i in ids], dtype=np.float64)
        floor = np.array([np.nan if thresholds.get((i, role, task, gate)) is None else thresholds[(i, role, task, gate)] for i in ids])
        for c in token_changes(v, a, floor, min_nights=min_nights):
            out.append(_change_dict(history, c, "token", task, f"{source}_{measure}", role, ids[c.index], ids[c.last_good], nights[c.index], flipped=[]))
    return out


def _change_dict(history: History, c: Change, kind: str, task: str, metric: str, variant: str, first_bad: str,
                 last_good: str, night: dict[str, Any], flipped: list[dict[str, Any]]) -> dict[str, Any]:
    regression = (c.direction == "down") if kind == "score" else (c.direction == "up")
    scale = 100 if kind == "score" else 1
    unit = " points" if kind == "score" else ""
    word = {"flagged": "changed", "pending": "moved (pending: not yet lasting)", "not significant": "moved (not significant)"}[c.state]
    summary = (f"{task} {metric} of {variant} {word} at {first_bad}: {c.before:.4g} → {c.after:.4g} "
               f"({(c.delta) * scale:+.3g}{unit}"
               + (f", paired p {c.p_value:.2g}" if c.p_value is not None else "")
               + f", {c.nights_after} night{'s' if c.nights_after != 1 else ''} so far" * c.open
               + (f", lasted {c.nights_after} night{'s' if c.nights_after != 1 else ''}" if not c.open else "") + ")")
    return {
        "kind": kind, "task": task, "metric": metric, "variant": variant, "run_id": first_bad, "night": _night_label(night["started_at"]),
        "direction": c.direction, "before": c.before, "after": c.after, "delta": c.delta, "p_value": c.p_value,
        "nights_after": c.nights_after, "open": c.open, "state": c.state, "regression": regression,
        "summary": summary, "flipped": flipped, "bisect": bisect_hint(history, last_good, first_bad, variant),
        "last_good": last_good, "first_bad": first_bad, "report": None,
    }


# ---------------------------------------------------------------------------
# judging a recorded night
# ---------------------------------------------------------------------------


def _add_prompts(change: dict[str, Any], vdir: Path, keep: int = 300) -> None:
    """The end of each flipped item's prompt (where the question is), from the first bad
    night's samples, when its run directory is still there."""
    path = artifacts.VariantDir(vdir).samples
    if not path.is_file():
        return
    cols = artifacts.read_table(path).select(["task", "doc_id", "repeat", "prompt"]).to_pydict()
    prompts = {(t, int(d), int(r)): p for t, d, r, p in zip(cols["task"], cols["doc_id"], cols["repeat"], cols["prompt"])}
    for f in change["flipped"]:
        text = prompts.get((change["task"], f["doc_id"], f["repeat"]))
        f["prompt"] = None if text is None else ("…" + text[-keep:] if len(text) > keep else text)


def series_nights(history: History, run_id: str) -> list[dict[str, Any]]:
    """The nights of the same config up to and including ``run_id``, oldest first."""
    tonight = history.run(run_id)
    return [n for n in history.runs(kind="nightly", config_hash=tonight["config_hash"]) if n["started_at"] <= tonight["started_at"]]


def judge(history: History, run_id: str, *, alpha: float = 1e-3, min_nights: int = 2) -> Judgement:
    """Judge a night already in the history; stores the result and returns it."""
    tonight = history.run(run_id)
    j = Judgement(run_id=run_id, verdict=tonight.get("verdict"))
    tonight_dir = Path(tonight["run_dir"])
    if tonight.get("status") != "ok":
        j.fail(f"tonight's run {run_id} did not finish ({tonight.get('status')})", "FAILED")
    else:
        if tonight.get("verdict") is not None and tonight["verdict"] not in (*PASSING, INCONCLUSIVE):
            j.fail(f"tonight's variants differ from the reference {tonight.get('reference')}: {tonight['verdict']}")
        j.paths = tonight_inconclusive(tonight_dir, tonight.get("verdict"))
        if j.paths:
            j.fail(j.paths, INCONCLUSIVE)
    nights = series_nights(history, run_id)
    floor = None
    for v in history.variants_of(run_id):
        if v["role"] == "aa":
            continue
        base = baseline_of(history, v["name"], nights, tonight=run_id)
        if base is None or base == run_id:
            continue
        j.baseline = j.baseline or base
        base_dir = Path(history.run(base)["run_dir"])
        if not (base_dir / v["name"]).is_dir():
            j.vs_baseline.append({"variant": v["name"], "baseline": base, "error": f"the baseline's run directory {base_dir} has no {v['name']} (moved or deleted)"})
            continue
        if floor is None:
            floor = tonight_floor(tonight_dir)
        entry = {**vs_baseline(base_dir, tonight_dir, v["name"], floor), "baseline": base}
        j.vs_baseline.append(entry)
        if entry.get("error"):
            j.fail(f"{v['name']} cannot be compared with baseline {base}: {entry['error']}")
        elif entry["status"] == INCONCLUSIVE:
            j.fail(f"{v['name']}'s comparison with baseline {base} proves nothing about the paths: {first_path_reason(entry)}",
                   INCONCLUSIVE)
        elif entry["status"] not in PASSING:
            first = entry["reasons"][0] if entry["reasons"] else ""
            j.fail(f"{v['name']} drifted from baseline {base}: {entry['status']} ({first})")
    if tonight.get("status") == "ok" and tonight.get("verdict") is None and not any("error" not in e for e in j.vs_baseline):
        j.compared = False
        j.fail(nothing_compared(tonight.get("reference")), INCONCLUSIVE)
    j.changes = series_changes(history, nights, alpha=alpha, min_nights=min_nights)
    for c in j.changes:
        if c["state"] == "flagged" and c["flipped"]:
            _add_prompts(c, Path(history.run(c["first_bad"])["run_dir"]) / c["variant"])
    for c in j.changes:
        if c["state"] == "flagged" and c["open"] and c["regression"]:
            hint = ", ".join(f"{b['component']} {b['before']} → {b['after']}" for b in c["bisect"][:3]) or "no component changed"
            j.fail(f"{c['summary']}; changed between {c['last_good']} and {c['first_bad']}: {hint}")
    history.set_judgement(run_id, j.status, j.baseline, j.to_dict())
    return j


# ---------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------


def write_night(run_dir: Path, j: Judgement, dashboard: Path | None = None) -> dict[str, Path]:
    paths = {"json": run_dir / NIGHTLY_JSON, "markdown": run_dir / NIGHTLY_MD, "junit": run_dir / NIGHTLY_JUNIT}
    write_nightly_document(paths["json"], j.to_document())  # first: the judgement outlives a failed rendering
    doc = j.to_document()
    artifacts.write_text(paths["markdown"], render_night_summary(doc, dashboard))
    artifacts.write_text(paths["junit"], render_night_junit(doc))
    return paths


def dashboard_data(history: History, config_hash: str | None, title: str, dashboard_path: Path) -> dict[str, Any]:
    """The dashboard's input (evalpipe.report.dashboard), from the history."""
    nights = history.runs(kind="nightly", config_hash=config_hash)
    ids = [n["run_id"] for n in nights]

    def href(n: dict[str, Any]) -> str | None:
        report = Path(n["run_dir"]) / REPORT_HTML
        if not report.is_file():
            return None
        return os.path.relpath(report, dashboard_path.parent)

    timeline = []
    for n in nights:
        j = n.get("judgement") or {}
        timeline.append({"run_id": n["run_id"], "night": _night_label(n["started_at"]), "status": n.get("nightly_status") or "PASS",
                         "verdict": n.get("verdict"), "report": href(n), "baseline": n.get("baseline_run_id"),
                         "reasons": list(j.get("reasons") or [])})
    latest_changes = (nights[-1].get("judgement") or {}).get("changes") if nights else None
    changes = [c for c in latest_changes or [] if c["state"] == "flagged"]
    by_id = {n["run_id"]: n for n in nights}
    for c in changes:
        c["report"] = href(by_id[c["run_id"]]) if c["run_id"] in by_id else None
    series: dict[tuple[str, str, str], dict[str, Any]] = {}
    same_night: dict[tuple[str, str, str], dict[str, float]] = {}  # (task, metric, run) -> role -> mean
    for r in history.score_rows(ids):
        if r["role"] in ("aa", "reference") and r["mean"] is not None:
            same_night.setdefault((r["task"], r["metric"], r["run_id"]), {})[r["role"]] = r["mean"]
        if r["role"] == "aa":
            continue
        s = series.setdefault((r["task"], r["metric"], r["variant"]), {"task": r["task"], "metric": r["metric"], "variant": r["variant"], "points": [], "changes": []})
        se = r["se"] or 0.0
        s["points"].append({"run_id": r["run_id"], "night": _night_label(r["started_at"]), "value": r["mean"],
                            "ci_low": None if r["mean"] is None else r["mean"] - 1.96 * se,
                            "ci_high": None if r["mean"] is None else r["mean"] + 1.96 * se, "n": r["n"]})
    for (task, metric, _variant), s in series.items():
        # The A/A band: how far two runs of the same engine on the same night lie apart
        # (the largest such gap in the history), drawn around the series' median level.
        gaps = [abs(m["reference"] - m["aa"]) for (t, mt, _), m in same_night.items() if (t, mt) == (task, metric) and len(m) == 2]
        values = [p["value"] for p in s["points"] if p["value"] is not None]
        if gaps and values:
            level, half = float(np.median(values)), max(gaps)
            s["aa_band"] = {"low": level - half, "high": level + half}
        else:
            s["aa_band"] = None
        idx = {p["run_id"]: i for i, p in enumerate(s["points"])}
        s["changes"] = [idx[c["run_id"]] for c in changes if c["kind"] == "score" and (c["task"], c["metric"], c["variant"]) == (task, metric, _variant) and c["run_id"] in idx]
    token_series: dict[tuple[str, str, str], dict[str, Any]] = {}
    aa_tok: dict[tuple[str, str, str], float | None] = {}
    for r in history.token_rows(ids):
        for source, measure in TOKEN_SERIES:
            if r["source"] != source:
                continue
            name = f"{source}_{measure}"
            if r["role"] == "aa":
                aa_tok[(r["task"], name, r["run_id"])] = r[measure]
                continue
            t = token_series.setdefault((r["task"], r["variant"], name), {"task": r["task"], "variant": r["variant"], "measure": name,
                                                                           "log": "kl" in measure, "points": [], "changes": []})
            t["points"].append({"run_id": r["run_id"], "night": _night_label(r["started_at"]), "value": r[measure], "aa_value": None})
    for (task, _variant, name), t in token_series.items():
        for p in t["points"]:
            p["aa_value"] = aa_tok.get((task, name, p["run_id"]))
        idx = {p["run_id"]: i for i, p in enumerate(t["points"])}
        t["changes"] = [idx[c["run_id"]] for c in changes if c["kind"] == "token" and (c["task"], c["metric"], c["variant"]) == (task, name, _variant) and c["run_id"] in idx]
    return {
        "title": title, "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "database": history.where,
        "nights": timeline, "series": list(series.values()), "token_series": list(token_series.values()),
        "changes": sorted(changes, key=lambda c: c["night"], reverse=True),
    }


def build_dashboard(history: History, config_hash: str | None, title: str, path: Path) -> Path:
    """Render the dashboard and write it atomically (a reader never sees half a page)."""
    artifacts.write_text(path, render_dashboard(dashboard_data(history, config_hash, title, path)))
    return path


__all__ = ["Judgement", "HistoryError", "judge", "write_night", "build_dashboard", "dashboard_data", "render_night_summary", "render_night_junit"]


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------


def parse_components(pairs: list[str] | None) -> dict[str, str]:
    """``--component vllm_ascend=1a2b3c`` (repeatable) as a mapping; ValueError in one sentence."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UserError(f"--component {pair!r} is not NAME=VERSION; pass e.g. --component vllm_ascend=1a2b3c4.")
        out[name.strip()] = value.strip()
    return out


@dataclass
class NightResult:
    run_dir: Path
    judgement: Judgement
    outputs: dict[str, Path]
    dashboard: Path

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.judgement.status]


def record_and_judge(history: History, run_dir: Path, *, labels: dict[str, str], alpha: float, min_nights: int,
                     dashboard: Path, title: str) -> NightResult:
    """Record a finished (or failed) night, judge it, write its outputs and the dashboard."""
    run_id = history.record(run_dir, kind="nightly", labels=labels)
    j = judge(history, run_id, alpha=alpha, min_nights=min_nights)
    outputs = write_night(run_dir, j, dashboard)
    build_dashboard(history, history.run(run_id)["config_hash"], title, dashboard)
    return NightResult(run_dir, j, outputs, dashboard)


def print_night(result: NightResult, console: Any) -> None:
    j = result.judgement
    colour = NIGHT_COLOURS[j.status]
    console.print(f"[bold]nightly {j.run_id}[/]: [bold {colour}]{j.status}[/]"
                  + (f" (baseline {j.baseline})" if j.baseline else " (no baseline yet)"))
    for reason in j.reasons:
        console.print(f"  - {reason}", soft_wrap=True, markup=False)
    for c in j.changes:
        if c["state"] in ("flagged", "pending") and c["open"]:
            console.print(f"  {c['state']}: {c['summary']}", soft_wrap=True, markup=False)
    console.print(f"summary: {result.outputs['markdown']}  junit: {result.outputs['junit']}  dashboard: {result.dashboard}")


DEFAULT_DASHBOARD = Path("reports/nightly/index.html")


def run_night(config_path: Path | None, console: Any, *, limit: int | None = None, variants: str | None = None,
              output: Path | None = None, history_url: str | None = None, dashboard: Path | None = None,
              labels: dict[str, str] | None = None, run_id: str | None = None, timeout_s: float | None = None,
              stall_timeout_s: float | None = None,
              from_run: Path | None = None, cluster: str | None = None) -> NightResult:
    """`evalpipe nightly`: run the config's nightly matrix (or take a finished run with
    ``from_run``), record it, judge it, write its summary and the dashboard. ``cluster``:
    --cluster, over the config's cluster.address (`off`: here)."""
    cfg = load_config(config_path)
    if cluster is not None:
        cfg = cfg.on_cluster(None if cluster == "off" else cluster)
    spec = cfg.nightly
    labels = labels or {}
    if from_run is not None:
        run_dir = Path(from_run)
        if not (run_dir / RUN_JSON).is_file():
            raise HistoryError(f"--from-run {run_dir} is not a run directory (no run.json); pass reports/runs/<run_id>.")
        output_root = run_dir.parent
    else:
        chosen = variants or (",".join(spec.variants) if spec.variants else None)
        plan = make_plan(cfg, config_label(config_path), spec.tasks, limit=limit or spec.limit,
                         variants=chosen, output=str(output) if output else None,
                         run_id=run_id or time.strftime("nightly-%Y%m%d-%H%M%S", time.gmtime()))
        run_dir, output_root = plan.run_dir, plan.run_dir.parent
        history = open_history(history_url or spec.history, output_root)  # fail before hours of work, not after
        plan.teacher_baseline_dir = baseline_reference_dir(history, plan.config_sha256, plan.reference)
        if plan.teacher_baseline_dir is not None:
            console.print(f"[dim]baseline night: {plan.teacher_baseline_dir.parent.name} (its sequences are teacher-forced too)[/]")
        try:
            execute(plan, console, timeout_s, extra_info={"kind": "nightly", "components": labels}, record=False,
                    stall_timeout_s=stall_timeout_s)
        except RunFailed as err:
            console.print(f"[bold red]tonight's run failed:[/] {err}", soft_wrap=True)
            if not (run_dir / RUN_JSON).is_file():
                raise
    history = open_history(history_url or spec.history, output_root)
    title = f"evalpipe nightly: {config_label(config_path)}"
    result = record_and_judge(history, run_dir, labels=labels, alpha=spec.alpha, min_nights=spec.min_nights,
                              dashboard=Path(dashboard or spec.dashboard or DEFAULT_DASHBOARD), title=title)
    _append_ci_summary(result)
    return result


def baseline_reference_dir(history: History, config_hash: str, reference: str) -> Path | None:
    """The reference directory of the night tonight will be judged against, when its
    artifacts are still there (pinned, else the last passing night of this config)."""
    base = baseline_of(history, reference, history.runs(kind="nightly", config_hash=config_hash))
    if base is None:
        return None
    ref_dir = Path(history.run(base)["run_dir"]) / reference
    vd = artifacts.VariantDir(ref_dir)
    return ref_dir if vd.samples.is_file() and vd.tokens.is_file() else None


def _append_ci_summary(result: NightResult) -> None:
    """CI systems that show a Markdown step summary name its file in $GITHUB_STEP_SUMMARY."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(result.outputs["markdown"].read_text(encoding="utf-8"))
