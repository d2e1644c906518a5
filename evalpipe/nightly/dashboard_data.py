"""The nightly dashboard's data, from the history: every night, each score series with
its A/A band and flagged changes, each token series (rendered by evalpipe.report.dashboard)."""


from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from evalpipe.documents.dashboard_doc import (
    Band,
    DashboardData,
    NightEntry,
    ScoreSeries,
    ScoreValue,
    TokenSeries,
    TokenValue,
)
from evalpipe.documents.history_rows import RecordedRun, ScorePoint, TokenPoint
from evalpipe.documents.nightly_doc import NightStatus, SeriesChange
from evalpipe.history.store import History
from evalpipe.nightly.judging import TOKEN_SERIES, night_label
from evalpipe.report.dashboard import render_dashboard
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import REPORT_HTML


def dashboard_data(history: History, config_hash: str | None, title: str, dashboard_path: Path) -> DashboardData:
    """The dashboard's input (evalpipe.report.dashboard), from the history."""
    nights = history.runs(kind="nightly", config_hash=config_hash)
    ids = [n.run_id for n in nights]

    def href(n: RecordedRun) -> str | None:
        report = Path(n.run_dir) / REPORT_HTML
        if not report.is_file():
            return None
        return os.path.relpath(report, dashboard_path.parent)

    timeline = [NightEntry(run_id=n.run_id, night=night_label(n.started_at), status=n.nightly_status or NightStatus.PASS,
                           verdict=n.verdict, report=href(n), baseline=n.baseline_run_id,
                           reasons=n.judgement.reasons if n.judgement else [])
                for n in nights]
    latest = nights[-1].judgement if nights else None
    by_id = {n.run_id: n for n in nights}
    changes = [c.model_copy(update={"report": href(by_id[c.run_id]) if c.run_id in by_id else None})
               for c in (latest.changes if latest else []) if c.state == "flagged"]
    return DashboardData(
        title=title, generated_at=night_label(time.time()), database=history.where,
        nights=timeline, series=_score_series(history.score_rows(ids), changes),
        token_series=_token_series(history.token_rows(ids), changes),
        changes=sorted(changes, key=lambda c: c.night, reverse=True),
    )


def _score_series(rows: list[ScorePoint], changes: list[SeriesChange]) -> list[ScoreSeries]:
    """Each task x metric x variant's nights, with the A/A band: how far two runs of the same
    engine on the same night lie apart (the largest such gap in the history), drawn around
    the series' median level."""
    points: dict[tuple[str, str, str], list[ScoreValue]] = {}
    same_night: dict[tuple[str, str, str], dict[str, float]] = {}  # (task, metric, run) -> role -> mean
    for r in rows:
        if r.role in ("aa", "reference") and r.mean is not None:
            same_night.setdefault((r.task, r.metric, r.run_id), {})[r.role] = r.mean
        if r.role == "aa":
            continue
        se = r.se or 0.0
        points.setdefault((r.task, r.metric, r.variant), []).append(ScoreValue(
            run_id=r.run_id, night=night_label(r.started_at), value=r.mean, n=r.n,
            ci_low=None if r.mean is None else r.mean - 1.96 * se, ci_high=None if r.mean is None else r.mean + 1.96 * se))
    out = []
    for (task, metric, variant), values in points.items():
        gaps = [abs(m["reference"] - m["aa"]) for (t, mt, _), m in same_night.items() if (t, mt) == (task, metric) and len(m) == 2]
        means = [p.value for p in values if p.value is not None]
        band = None
        if gaps and means:
            level, half = float(np.median(means)), max(gaps)
            band = Band(low=level - half, high=level + half)
        out.append(ScoreSeries(task=task, metric=metric, variant=variant, points=values, aa_band=band,
                               changes=_change_indexes(values, changes, "score", task, metric, variant)))
    return out


def _token_series(rows: list[TokenPoint], changes: list[SeriesChange]) -> list[TokenSeries]:
    """Each task x variant x token measure's nights, beside the same night's A/A value."""
    points: dict[tuple[str, str, str], list[tuple[str, float, float | None]]] = {}
    aa: dict[tuple[str, str, str], float | None] = {}
    for r in rows:
        for source, measure in TOKEN_SERIES:
            if r.source != source:
                continue
            name = f"{source}_{measure}"
            if r.role == "aa":
                aa[(r.task, name, r.run_id)] = r.measure(measure)
            else:
                points.setdefault((r.task, r.variant, name), []).append((r.run_id, r.started_at, r.measure(measure)))
    out = []
    for (task, variant, name), found in points.items():
        values = [TokenValue(run_id=run_id, night=night_label(started), value=value, aa_value=aa.get((task, name, run_id)))
                  for run_id, started, value in found]
        out.append(TokenSeries(task=task, variant=variant, measure=name, log="kl" in name, points=values,
                               changes=_change_indexes(values, changes, "token", task, name, variant)))
    return out


def _change_indexes(points: Sequence[ScoreValue | TokenValue], changes: list[SeriesChange], kind: str, task: str,
                    metric: str, variant: str) -> list[int]:
    """Where in a series each of its flagged changes starts."""
    index = {p.run_id: i for i, p in enumerate(points)}
    return [index[c.run_id] for c in changes
            if (c.kind, c.task, c.metric, c.variant) == (kind, task, metric, variant) and c.run_id in index]


def build_dashboard(history: History, config_hash: str | None, title: str, path: Path) -> Path:
    """Render the dashboard and write it atomically (a reader never sees half a page)."""
    artifacts.write_text(path, render_dashboard(dashboard_data(history, config_hash, title, path)))
    return path
