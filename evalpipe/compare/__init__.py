"""Compare variants from their stored artifacts (pure functions; no engine imports)."""

from evalpipe.compare.gates import AASummaries, GateResult, evaluate_gates
from evalpipe.compare.run import (
    COMPARE_SCHEMA_VERSION,
    RunComparison,
    VariantComparison,
    compare_across_runs,
    compare_run,
    compare_tables,
    compare_variants,
    load_teacher,
    load_variant,
    read_run_info,
    write_outputs,
)
from evalpipe.compare.scores import PairedScores, ScoreComparison, ScoreRow, compare_scores, paired_scores
from evalpipe.compare.tokens import (
    SampleTokenDiffs,
    TaskTokenSummary,
    TokenComparison,
    WorstExample,
    compare_tokens,
)
from evalpipe.compare.verdict import Status, Verdict, decide, worst_status

__all__ = [
    "AASummaries",
    "COMPARE_SCHEMA_VERSION",
    "GateResult",
    "PairedScores",
    "RunComparison",
    "SampleTokenDiffs",
    "ScoreComparison",
    "ScoreRow",
    "Status",
    "TaskTokenSummary",
    "TokenComparison",
    "Verdict",
    "VariantComparison",
    "WorstExample",
    "compare_across_runs",
    "compare_run",
    "compare_scores",
    "compare_tables",
    "compare_tokens",
    "compare_variants",
    "decide",
    "evaluate_gates",
    "load_teacher",
    "load_variant",
    "paired_scores",
    "read_run_info",
    "worst_status",
    "write_outputs",
]
