"""Dashboard data for the dashboard tests, as dicts a test can edit, in the shape of the
dashboard's document (evalpipe.documents.dashboard_doc.DashboardData; `render` validates
and renders one).

`sample_history` is small and hand-written (one flagged change, hostile text in the
places untrusted text reaches the page); `synthetic_history` is a year of nights for
the structural check and for timing the renderer.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from evalpipe.documents.dashboard_doc import DashboardData
from evalpipe.report.dashboard import render_dashboard

SCRIPT = "<script>window.__pwned=1</script>"
IMG = '<img src=x onerror="window.__pwned=1">'
START = datetime(2025, 1, 1, 2, 0, tzinfo=timezone.utc)


def render(data: dict) -> str:
    """The page of a sample's data (validated as the dashboard's document)."""
    return render_dashboard(DashboardData.model_validate(data))


def night_iso(i: int) -> str:
    return (START + timedelta(days=i)).isoformat().replace("+00:00", "Z")


def run_id(i: int) -> str:
    return f"run-{i:04d}"


INCONCLUSIVE_REASON = ("tonight's comparison proves nothing about the paths: variant `sp` never called "
                       "`evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention` (0 calls in 1 process)")


def sample_history(n_nights: int = 8, change_at: int = 5, task: str = "gsm8k", inconclusive: tuple[int, ...] = ()) -> dict:
    """`n_nights` nights of one task, a score drop at night `change_at` that lasts, and
    payloads in a flipped prompt, a component version and a reason. The nights in
    `inconclusive` proved nothing about the code paths (sp silently ran legacy's)."""
    nights, points, tokens = [], [], []
    for i in range(n_nights):
        bad = i >= change_at
        unproven = i in inconclusive
        nights.append({
            "run_id": run_id(i), "night": night_iso(i),
            "status": "INCONCLUSIVE" if unproven else "REGRESSION" if bad else "PASS",
            "verdict": "INCONCLUSIVE" if unproven else "DIVERGENT" if bad else "EQUIVALENT",
            "report": f"runs/{run_id(i)}/report.html",
            "baseline": run_id(0) if i else None,
            "reasons": [INCONCLUSIVE_REASON] if unproven else [f"strict-match fell below the A/A band {IMG}"] if bad else [],
        })
        v = 0.44 if bad else 0.482 + (0.002 if i % 2 else -0.002)
        points.append({"run_id": run_id(i), "night": night_iso(i), "value": v,
                       "ci_low": v - 0.03, "ci_high": v + 0.03, "n": 500})
        tokens.append({"run_id": run_id(i), "night": night_iso(i),
                       "value": 0.0 if i == 0 else (2e-2 if bad else 3e-5 * (i + 1)), "aa_value": 1e-5})
    return {
        "title": "evalpipe nightly — configs/default.yaml",
        "generated_at": "2025-01-09T06:00:00Z",
        "database": "postgresql://evalpipe@db.example/history",
        "nights": nights,
        "series": [{
            "task": task, "metric": "exact_match,strict-match", "variant": "sp",
            "points": points, "aa_band": {"low": 0.47, "high": 0.495}, "changes": [change_at],
        }],
        "token_series": [{
            "task": task, "variant": "sp", "measure": "teacher_kl_p99", "log": True,
            "points": tokens, "changes": [change_at],
        }],
        "changes": [{
            "kind": "score", "task": task, "metric": "exact_match,strict-match", "variant": "sp",
            "run_id": run_id(change_at), "night": night_iso(change_at), "direction": "down",
            "before": 0.482, "after": 0.44, "delta": -0.042, "p_value": 0.0031,
            "nights_after": n_nights - change_at - 1, "open": True, "state": "flagged", "regression": True,
            "summary": "strict-match fell 4.2 points on sp and stayed down.",
            "flipped": [{"doc_id": d, "repeat": 0, "before": 1.0, "after": 0.0,
                         "prompt": f"Question {d}: {SCRIPT} {IMG} how many apples?" if d == 3 else f"Question {d}"}
                        for d in range(25)],
            "bisect": [{"component": "vllm", "before": "0.32.0", "after": f"0.32.1+{SCRIPT}"},
                       {"component": "evalpipe", "before": None, "after": "abc123"}],
            "last_good": run_id(change_at - 1), "first_bad": run_id(change_at),
            "report": f"runs/{run_id(change_at)}/report.html",
        }],
    }


def synthetic_history(n_nights: int = 365, n_tasks: int = 10, variants=("legacy", "sp", "fused"),
                      metrics=("exact_match,strict-match", "exact_match,flexible-extract"),
                      measures=("teacher_kl_p99", "teacher_kl_max", "free_hard_divergences"), seed: int = 0) -> dict:
    """A year of nights: noisy scores with gaps, one lasting drop per task, token measures with zeros."""
    rng = random.Random(seed)
    nights = [{"run_id": run_id(i), "night": night_iso(i),
               "status": rng.choice(["PASS"] * 12 + ["REGRESSION", "FAILED", "INCONCLUSIVE"]), "verdict": "EQUIVALENT",
               "report": f"runs/{run_id(i)}/report.html", "baseline": run_id(0), "reasons": []}
              for i in range(n_nights)]
    series, token_series, changes = [], [], []
    for t in range(n_tasks):
        task = f"task{t:02d}"
        change_at = n_nights // 2 + t
        for variant in variants:
            for metric in metrics:
                pts = []
                for i in range(n_nights):
                    v = None if rng.random() < 0.02 else 0.5 + rng.gauss(0, 0.01) - (0.05 if i >= change_at else 0)
                    pts.append({"run_id": run_id(i), "night": night_iso(i), "value": v,
                                "ci_low": None if v is None else v - 0.02, "ci_high": None if v is None else v + 0.02,
                                "n": 1319})
                series.append({"task": task, "metric": metric, "variant": variant, "points": pts,
                               "aa_band": {"low": 0.48, "high": 0.52}, "changes": [change_at]})
            for measure in measures:
                log = measure != "free_hard_divergences"
                pts = [{"run_id": run_id(i), "night": night_iso(i),
                        "value": (0.0 if rng.random() < 0.1 else 10 ** rng.uniform(-6, -2)) if log else float(rng.randint(0, 5)),
                        "aa_value": 10 ** rng.uniform(-6, -4) if log else float(rng.randint(0, 2))}
                       for i in range(n_nights)]
                token_series.append({"task": task, "variant": variant, "measure": measure, "log": log,
                                     "points": pts, "changes": []})
        changes.append({
            "kind": "score", "task": task, "metric": metrics[0], "variant": variants[-1],
            "run_id": run_id(change_at), "night": night_iso(change_at), "direction": "down",
            "before": 0.5, "after": 0.45, "delta": -0.05, "p_value": 1e-6,
            "nights_after": n_nights - change_at - 1, "open": True, "state": "flagged", "regression": True,
            "summary": f"{task} dropped 5 points.",
            "flipped": [{"doc_id": d, "repeat": 0, "before": 1.0, "after": 0.0, "prompt": f"prompt {d}"} for d in range(300)],
            "bisect": [{"component": "vllm", "before": "0.32.0", "after": "0.32.1"}],
            "last_good": run_id(change_at - 1), "first_bad": run_id(change_at), "report": None,
        })
    return {"title": "evalpipe nightly — synthetic", "generated_at": night_iso(n_nights), "database": "sqlite:///history.db",
            "nights": nights, "series": series, "token_series": token_series, "changes": changes[::-1]}
