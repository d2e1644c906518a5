"""The nightly dashboard's data, from the history: every night, each score series with
its A/A band and flagged changes, each token series (rendered by evalpipe.report.dashboard)."""


from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from evalpipe.history.store import History
from evalpipe.nightly.judging import TOKEN_SERIES, night_label
from evalpipe.report.dashboard import render_dashboard
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import REPORT_HTML


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
        timeline.append({"run_id": n["run_id"], "night": night_label(n["started_at"]), "status": n.get("nightly_status") or "PASS",
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
        s["points"].append({"run_id": r["run_id"], "night": night_label(r["started_at"]), "value": r["mean"],
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
            t["points"].append({"run_id": r["run_id"], "night": night_label(r["started_at"]), "value": r[measure], "aa_value": None})
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
