"""Compare variants from their artifacts as in-memory tables (pure functions; no engine imports).

Reading a run directory into these functions and writing compare.json and the
reports back is :mod:`evalpipe.pipeline.comparing`."""

from evalpipe.compare.gates import AASummaries, GateResult, evaluate_gates
from evalpipe.compare.run import RunComparison, VariantComparison, compare_tables
from evalpipe.compare.scores import PairedScores, ScoreComparison, compare_scores, paired_scores
from evalpipe.compare.token_results import SampleTokenDiffs, TokenComparison
from evalpipe.compare.tokens import compare_tokens
from evalpipe.compare.verdict import Verdict, decide, worst_status
from evalpipe.documents.comparison import ScoreRow, Status, TokenSummary, WorstExample

__all__ = [
    "AASummaries",
    "GateResult",
    "PairedScores",
    "RunComparison",
    "SampleTokenDiffs",
    "ScoreComparison",
    "ScoreRow",
    "Status",
    "TokenComparison",
    "TokenSummary",
    "Verdict",
    "VariantComparison",
    "WorstExample",
    "compare_scores",
    "compare_tables",
    "compare_tokens",
    "decide",
    "evaluate_gates",
    "paired_scores",
    "worst_status",
]
