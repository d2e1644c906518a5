"""Hand-built compare.json documents for the report tests, and the renderers taking them.

The builders write compare.json dicts by hand, so the renderers are tested without
running a comparison; :func:`as_document` makes them the typed document the renderers
take (evalpipe/documents/comparison.py), :func:`as_run` does the same for run.json.
Imported by plain name (tests/conftest.py puts tests/support on sys.path).
"""

from __future__ import annotations

import copy
from typing import Any

from rich.console import Console

from evalpipe import report
from evalpipe.documents.comparison import ComparisonDocument
from evalpipe.documents.run_doc import RunDocument
from evalpipe.report import what_ran

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TASK = "gsm8k_synth_4shot"
METRIC = "exact_match,strict-match"
NASTY = "x | y `rm -rf` <script>alert(1)</script>\nsecond line"
# everything a model or a dataset can put into an HTML cell that must stay text
HOSTILE = "<script>alert(1)</script> </td> & \"dq\" 'sq'\nnext line"

RUN_INFO = {
    "run_id": "run-1",
    "model": {"name": "tiny-layout", "path": "abc"},
    "fingerprints": {"config_sha256": "m123", "code": "t456"},
    "variants": ["legacy", "sp"],
    "variant_settings": {"legacy": {"env": {"LAYOUT": "legacy", "OMP": "1"}}, "sp": {"env": {"LAYOUT": "sp", "OMP": "1"}}},
    "reference": "legacy",
    "timings": {"model_s": 12.5, "total_s": 11.0},
    "versions": {"vllm": "0.32.0"},
}


def as_run(run_info: dict[str, Any] | RunDocument | None) -> RunDocument | None:
    """run.json as the renderers get it: the typed document."""
    return run_info if run_info is None or isinstance(run_info, RunDocument) else RunDocument.model_validate(run_info)


# ---------------------------------------------------------------------------
# compare.json builders (shape of ScoreRow / TokenSummary / GateResult to_dict)
# ---------------------------------------------------------------------------


def score_row(**kw: Any) -> dict[str, Any]:
    """6 items, A = [0,1,0,1,0,1], B flips doc 2 to right (the numbers of the statistics test)."""
    row = {
        "task": TASK, "metric": METRIC, "n_paired": 6, "mean_a": 0.5, "mean_b": 2 / 3, "delta": 1 / 6,
        "n_changed": 1, "n_missing": 0, "binary": True, "a_right_b_wrong": 0, "a_wrong_b_right": 1,
        "identical": False, "only_a": 0, "only_b": 0, "se_a": 0.2236, "se_b": 0.2108, "se_delta": 1 / 6,
        "ci_low": -0.2618, "ci_high": 0.5951, "ci_conf": 0.95, "df": 5, "n_clusters": 6, "mcnemar_p": 1.0,
        "margin": 0.01, "tost_ci_low": -0.1692, "tost_ci_high": 0.50255, "tost_p_lower": 0.2, "tost_p_upper": 0.8,
        "equivalent": False, "mdd": 0.5817, "n_flipped": 1,
        "flipped": [flipped(2)],
    }
    row.update(kw)
    return row


def flipped(doc: int, text: str = NASTY) -> dict[str, Any]:
    return {
        "doc_id": doc, "repeat": 0, "score_a": 0.0, "score_b": 1.0, "question": f"Question {doc}?",
        "target": "4|2", "response_a": "The answer is 2.", "response_b": text, "answer_a": "2", "answer_b": "4",
    }


def worst(kind: str, doc: int, pos: int, **kw: Any) -> dict[str, Any]:
    w = {
        "kind": kind, "task": TASK, "doc_id": doc, "repeat": 0, "pos": pos,
        "token_a": 13881, "token_b": 11, "logprob_a": -0.4053, "logprob_b": -0.9,
        "abs_dlogprob": 0.4947, "topk_ids_a": [13881, 11, 13883], "topk_logprobs_a": [-0.4053, -1.405, -2.405],
        "topk_ids_b": [11, 13881, 13], "topk_logprobs_b": [-0.9, -1.0, -2.4], "len_a": 8, "len_b": 8,
        "response_a": "The answer is 2.", "response_b": NASTY, "target": "42",
    }
    w.update(kw)
    return w


def hist(zero: int, counts: dict[int, int]) -> dict[str, Any]:
    decades = list(range(-10, 3))
    return {"decades": decades, "zero": zero, "counts": [counts.get(d, 0) for d in decades]}


def token_summary(**kw: Any) -> dict[str, Any]:
    t = {
        "task": TASK, "n_samples": 6, "only_a": 0, "only_b": 0, "only_a_keys": [], "only_b_keys": [],
        "n_ids_identical": 5, "n_identical": 5, "n_logprob_diff_same_ids": 0, "n_topk_diff_same_ids": 0,
        "n_length_diff": 0, "tokens_a": 48, "tokens_b": 48, "n_positions_compared": 44,
        "n_positions_logprob_diff": 3, "divergence_positions": [4], "median_first_divergence": 4.0,
        "max_abs_dlogprob": 0.02, "mean_abs_dlogprob": 0.001, "max_abs_dlogprob_same_ids": 0.0,
        "worst_divergence": [worst("earliest_divergence", 2, 4)], "worst_logprob": [], "near_tie_gap": 0.5,
        "n_near_tie_divergences": 0, "n_hard_divergences": 1, "hard_divergences": [[2, 0, 4]],
        "n_positions_topk_equal": 44, "share_topk_equal": 1.0, "kl_p50": 0.0, "kl_p99": 1e-4, "kl_max": 3e-4,
        "abs_dlogprob_p50": 0.0, "abs_dlogprob_p99": 0.01, "n_divergent": 1, "share_ids_identical": 5 / 6,
        "share_identical": 5 / 6, "identical": False,
        # fields that newer compare.json files carry
        "n_top1_disagree": 0, "n_top1_hard": 0, "share_top1_agree": 1.0, "top1_hard_positions": [],
        "kl_max_at": [3, 0, 6], "worst_kl": [],
        "kl_hist": hist(40, {-6: 2, -4: 2}), "abs_dlogprob_hist": hist(41, {-3: 2, -2: 1}),
    }
    t.update(kw)
    return t


def teacher_summary(**kw: Any) -> dict[str, Any]:
    defaults = {
        "n_ids_identical": 6, "n_identical": 2, "divergence_positions": [], "median_first_divergence": None,
        "n_hard_divergences": 0, "hard_divergences": [], "worst_divergence": [], "n_positions_compared": 48,
        "n_positions_topk_equal": 47, "kl_p50": 1e-6, "kl_p99": 0.004, "kl_max": 0.3, "kl_max_at": [5, 0, 7],
        "n_top1_disagree": 2, "n_top1_hard": 1, "share_top1_agree": 46 / 48, "top1_hard_positions": [[5, 0, 7]],
        "worst_kl": [worst("largest_kl", 5, 7, kl=0.3, context=f"Question 5? {HOSTILE} so the answer", token_text_a=" 4", token_text_b="\n")],
        "worst_logprob": [worst("largest_dlogprob", 5, 7, context=None)],
        "kl_hist": hist(3, {-6: 20, -4: 20, -3: 4, -1: 1}), "abs_dlogprob_hist": hist(10, {-4: 30, -2: 7, 0: 1}),
    }
    defaults.update(kw)
    return token_summary(**defaults)


def gate(name: str, status: str, measured: float | None, threshold: float | None, **kw: Any) -> dict[str, Any]:
    g = {
        "gate": name, "task": TASK, "metric": None, "status": status, "measured": measured,
        "threshold": threshold, "aa_value": None, "detail": f"{name}: {status}", "evidence": [],
    }
    g.update(kw)
    return g


def comparison(variant: str = "sp", reference: str = "legacy", **kw: Any) -> dict[str, Any]:
    c = {
        "a": reference, "b": variant, "reference": reference, "variant": variant, "status": "DIVERGENT",
        "reasons": [f"{TASK} teacher_kl_max: 0.3 > 0.1 (largest at doc 5 pos 7)"],
        "samples": {"a": 6, "b": 6},
        "scores": [score_row()], "metrics_only_a": [], "metrics_only_b": [],
        "tokens": [token_summary()],
        "teacher": [teacher_summary()],
        "gates": [
            gate("score_equivalence", "pass", 0.005, 0.01, metric=METRIC),
            gate("score_mcnemar", "pass", 1.0, 0.05, metric=METRIC),
            gate("free_hard_divergences", "fail", 1, 0, aa_value=0, evidence=["doc 2 repeat 0 pos 4"]),
            gate("teacher_kl_p99", "pass", 0.004, 0.006, aa_value=0.002),
            gate("teacher_kl_max", "fail", 0.3, 0.1, aa_value=0.01,
                 detail="KL 0.3 > 0.1 at doc 5 pos 7", evidence=["doc 5 repeat 0 pos 7"]),
            gate("teacher_hard_top1_flips", "skip", None, None, detail="no teacher-forced data for this task"),
        ],
    }
    c.update(kw)
    return c


def noise_floor() -> dict[str, Any]:
    return comparison(
        "legacy-aa", status="EQUIVALENT", reasons=[], gates=[], scores=[score_row(delta=0.0, mean_b=0.5, flipped=[], n_flipped=0)],
        tokens=[token_summary(n_ids_identical=6, n_identical=6, divergence_positions=[], n_hard_divergences=0,
                              hard_divergences=[], worst_divergence=[], kl_hist=hist(44, {}), abs_dlogprob_hist=hist(44, {}))],
        teacher=[teacher_summary(kl_p99=0.002, kl_max=0.01, n_top1_hard=0, top1_hard_positions=[], worst_kl=[],
                                 worst_logprob=[], kl_hist=hist(10, {-7: 30, -5: 8}))],
    )


def make_compare(**kw: Any) -> dict[str, Any]:
    """A DIVERGENT run: one variant with scores, free-running, teacher-forced and A/A data, six gates."""
    d = {
        "schema_version": 2, "run_id": "run-1", "reference": "legacy", "variants": ["sp"], "status": "DIVERGENT",
        "gates": {
            "scores": {"margin": 0.01, "alpha": 0.05, "require_equivalence": True, "fail_on_significant": True},
            "tokens": {"teacher_kl_max": {"abs": 0.1, "rel_aa": 3.0}},
        },
        "noise_floor": noise_floor(),
        "comparisons": [comparison()],
    }
    d.update(kw)
    return d


def identical_compare() -> dict[str, Any]:
    """An IDENTICAL run in the old layout: no gates, no teacher-forced or A/A data, no new token fields."""
    old_keys = ("n_top1_disagree", "n_top1_hard", "share_top1_agree", "top1_hard_positions", "kl_max_at",
                "worst_kl", "kl_hist", "abs_dlogprob_hist")
    t = token_summary(n_ids_identical=6, n_identical=6, divergence_positions=[], median_first_divergence=None,
                      n_hard_divergences=0, hard_divergences=[], worst_divergence=[], n_positions_compared=48,
                      n_positions_topk_equal=48, kl_p99=0.0, kl_max=0.0, max_abs_dlogprob=0.0, abs_dlogprob_p99=0.0,
                      n_divergent=0, identical=True)
    for k in old_keys:
        del t[k]
    row = score_row(mean_b=0.5, delta=0.0, n_changed=0, a_wrong_b_right=0, identical=True, se_b=0.2236, se_delta=0.0,
                    ci_low=0.0, ci_high=0.0, tost_ci_low=0.0, tost_ci_high=0.0, equivalent=True, mdd=0.0,
                    n_flipped=0, flipped=[])
    c = comparison(status="IDENTICAL", reasons=[f"{TASK}: 6/6 samples bitwise identical"], scores=[row], tokens=[t])
    for k in ("teacher", "gates"):
        del c[k]
    return {"schema_version": 1, "run_id": "run-1", "reference": "legacy", "variants": ["sp"],
            "status": "IDENTICAL", "comparisons": [c]}


# Defaults of the compare.json fields the builders above leave out (the layout they
# follow predates them): what a comparison without them would have written.
_TOKEN_DEFAULTS = {"n_top1_disagree": 0, "n_top1_hard": 0, "share_top1_agree": None, "top1_hard_positions": [],
                   "kl_max_at": None, "worst_kl": [], "kl_hist": hist(0, {}), "abs_dlogprob_hist": hist(0, {})}
_COMPARISON_DEFAULTS = {"teacher": None, "gates": [], "distribution": None, "outputs_status": None, "paths": None,
                        "numerics": {"dtype": None, "source": "unknown", "precision": "half", "aa_identical": None,
                                     "floors": {}}}


def as_document(d: dict[str, Any] | ComparisonDocument) -> ComparisonDocument:
    """A builder's dict as the typed compare.json document (schema 3), the fields it leaves out filled in."""
    if isinstance(d, ComparisonDocument):
        return d
    d = copy.deepcopy(d)

    def fill(c: dict[str, Any]) -> dict[str, Any]:
        for key, value in _COMPARISON_DEFAULTS.items():
            c.setdefault(key, copy.deepcopy(value))
        for row in c["scores"]:
            row.setdefault("alpha", 0.05)
        for t in [*c["tokens"], *(c["teacher"] or [])]:
            for key, value in _TOKEN_DEFAULTS.items():
                t.setdefault(key, copy.deepcopy(value))
        return c

    d.update(schema_version=3, noise_floor=fill(d["noise_floor"]) if d.get("noise_floor") else None,
             comparisons=[fill(c) for c in d["comparisons"]], gates=d.get("gates") or {})
    return ComparisonDocument.model_validate(d)


def render_markdown(compare: dict[str, Any] | ComparisonDocument, run_info: dict[str, Any] | None = None) -> str:
    return report.render_markdown(as_document(compare), as_run(run_info))


def render_html(compare: dict[str, Any] | ComparisonDocument, run_info: dict[str, Any] | None = None, **kw: Any) -> str:
    return report.render_html(as_document(compare), as_run(run_info), **kw)


def print_summary(compare: dict[str, Any] | ComparisonDocument, console: Console | None = None) -> None:
    report.print_summary(as_document(compare), console)


def what_ran_view(compare: dict[str, Any] | ComparisonDocument, esc: Any) -> dict[str, Any] | None:
    return what_ran.what_ran_view(as_document(compare), esc)


def long_run_compare(tmp_path: Any, name: str = "run", **kw: Any) -> dict[str, Any]:
    """compare.json (a dict) of a real comparison of the hand-built long-context run of
    tests/compare/test_bylength.py: legacy vs sp, sp broken only at length 2049, with an A/A
    run whose 1024 item moved at one continuation position; ``kw`` goes to write_long_run."""
    from fakes import perturb_topk

    from evalpipe.pipeline.comparing import compare_run
    from tests.compare.test_bylength import apply, broken_at_2049, docs_at, write_long_run

    variants = broken_at_2049()
    s, t = variants["legacy"]
    variants["legacy-aa"] = (s, apply(t, [docs_at(1024)[0]], perturb_topk(1e-3, positions=[5])))
    run = write_long_run(tmp_path / name, variants, noise_floor="legacy-aa", **kw)
    return compare_run(run).doc.model_dump(mode="json")
