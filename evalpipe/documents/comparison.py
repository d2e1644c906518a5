"""compare.json: a run's comparison (written by evalpipe.pipeline.comparing.write_outputs, read by
the reports, the history and nightly).

The whole contract of the file is here. evalpipe.compare computes the comparison and
builds these models as it goes (no copies of them of its own; what the file cannot hold,
the per-item and per-position arrays, stays beside them in compare.run.VariantComparison);
everything that reads compare.json gets a :class:`ComparisonDocument` from :func:`read_comparison`.

The file is a pure function of the artifacts and the gates: sorted keys, NaN and
infinities as null, no timestamps or absolute paths, so the same run directory gives
the same bytes. Schema 3 (the first typed one) is what evalpipe wrote untyped since
the path probes ("paths", INCONCLUSIVE); older files are refused: they are derived
data, rewritten by ``evalpipe compare RUN``.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from evalpipe.atomic_files import write_text
from evalpipe.config.gate_settings import Gates
from evalpipe.config.sampling import Sampler
from evalpipe.documents.base import Document, validated
from evalpipe.documents.manifest import ProbeSummary
from evalpipe.errors import ExitCode, UserError

COMPARE_SCHEMA_VERSION: Final = 3



# A comparison's status and what follows from it, defined once: compare decides it, the
# documents carry it, the reports, nightly and the exit code read these rules.
class Status(str, Enum):
    IDENTICAL = "IDENTICAL"
    EQUIVALENT = "EQUIVALENT"
    INCONCLUSIVE = "INCONCLUSIVE"
    DIVERGENT = "DIVERGENT"

    @property
    def severity(self) -> int:
        return STATUS_SEVERITY[self]

    @property
    def passed(self) -> bool:
        """True for the statuses a CI run accepts (exit code 0)."""
        return self in PASSING

    @property
    def exit_code(self) -> int:
        """0 identical or equivalent, 1 divergent, 4 inconclusive (2 and 3: user error, failed run)."""
        return EXIT_CODES[self]

    def __str__(self) -> str:  # plain "IDENTICAL" in f-strings
        return self.value


PASSING = (Status.IDENTICAL, Status.EQUIVALENT)
EXIT_CODES = {Status.IDENTICAL: ExitCode.OK, Status.EQUIVALENT: ExitCode.OK, Status.DIVERGENT: ExitCode.DIVERGENT,
              Status.INCONCLUSIVE: ExitCode.INCONCLUSIVE}
# Higher is worse; the overall status of several comparisons is the worst one. A divergence
# found is a finding; an inconclusive comparison proves nothing either way, so one
# DIVERGENT comparison beside an INCONCLUSIVE one makes the run DIVERGENT.
STATUS_SEVERITY: dict[Status, int] = {Status.IDENTICAL: 0, Status.EQUIVALENT: 1, Status.INCONCLUSIVE: 2, Status.DIVERGENT: 3}


class GateStatus(str, Enum):
    """One gate's outcome: its measure within its threshold, beyond it, or not measurable
    on the data at hand (the gate says why)."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


Key = tuple[int, int]  # (doc_id, repeat)
Position = tuple[int, int, int]  # (doc_id, repeat, pos)


# ---------------------------------------------------------------------------
# scores (evalpipe.compare.scores)
# ---------------------------------------------------------------------------


class FlippedItem(Document):
    """One item whose score differs between A and B (for 0/1 metrics: a McNemar discordant
    pair), as compare.scores finds it.

    ``question`` is the prompt's last question (text after the final "Question:", else its
    last 200 characters); ``answer_a``/``answer_b`` the filtered answers of the metric's
    filter (``answer:<filter>`` columns) when the samples have them."""

    doc_id: int
    repeat: int
    score_a: float | None
    score_b: float | None
    question: str | None
    target: str | None
    response_a: str | None
    response_b: str | None
    answer_a: str | None = None
    answer_b: str | None = None


class ScoreRow(Document):
    """Summary of one task x metric over the paired items, as compare.scores builds it.

    ``n_paired`` counts items scored on both sides; ``n_missing`` items present on
    both sides but scored on one only. For 0/1 metrics ``a_right_b_wrong`` and
    ``a_wrong_b_right`` are McNemar's discordant counts b and c.

    Statistics over the ``n_paired`` items (formulas in evalpipe.compare.stats; ``None``
    where undefined, e.g. SEs with a single item): ``se_a``/``se_b`` SE of each mean;
    ``se_delta`` SE of the paired difference; ``ci_low``/``ci_high`` its ``ci_conf`` t
    interval with ``df`` degrees of freedom (n - 1, or clusters - 1); ``n_clusters`` =
    n_paired unless a ``cluster`` column groups items; ``mcnemar_p`` exact two-sided p (0/1
    metrics only); ``tost_*`` the equivalence test against ±``margin`` at level ``alpha``
    (its 1 - 2 alpha interval, one-sided p-values, ``equivalent``); ``mdd`` the minimum
    detectable difference (level ``alpha``, 80% power). When no item of a 0/1 metric
    changed the observed SE is 0 and would claim that any difference is detectable; ``mdd``
    then uses evalpipe.compare.stats.no_change_se (rule of three) instead. ``flipped`` lists
    the first items (by doc_id, repeat) whose score differs, ``n_flipped`` counts them all.
    """

    task: str
    metric: str
    n_paired: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None
    n_changed: int
    n_missing: int
    binary: bool
    a_right_b_wrong: int | None
    a_wrong_b_right: int | None
    identical: bool
    only_a: int
    only_b: int
    se_a: float | None
    se_b: float | None
    se_delta: float | None
    ci_low: float | None
    ci_high: float | None
    ci_conf: float | None
    df: int | None
    n_clusters: int
    mcnemar_p: float | None
    margin: float | None
    alpha: float | None
    tost_ci_low: float | None
    tost_ci_high: float | None
    tost_p_lower: float | None
    tost_p_upper: float | None
    equivalent: bool
    mdd: float | None
    n_flipped: int
    flipped: list[FlippedItem]


# ---------------------------------------------------------------------------
# tokens (evalpipe.compare.tokens)
# ---------------------------------------------------------------------------


class WorstExample(Document):
    """One notable position with both top-k lists, as compare.token_summary picks it.

    ``kind`` is "earliest_divergence" (a sample's first divergence), "largest_dlogprob"
    (where a sample's |dlogprob| peaked) or "largest_kl" (one of the task's positions with
    the largest symmetric top-k KL). Token / top-k fields of a side are None when that
    side has no token at ``pos`` (its sequence ended). ``kl`` is the position's symmetric
    KL (None off the shared prefix). ``context`` is the text of up to CONTEXT_TOKENS tokens
    of A before ``pos`` ("…" first when there are earlier ones) followed by A's token at
    ``pos`` in ``[[ ]]`` (empty brackets when A has none there); None when A's trace has no
    token texts. The ``*_text*`` fields: the text of each side's token and of its top-k
    entries, where the traces' token_text column knows the id."""

    kind: str
    task: str
    doc_id: int
    repeat: int
    pos: int
    token_a: int | None
    token_b: int | None
    logprob_a: float | None
    logprob_b: float | None
    abs_dlogprob: float | None
    topk_ids_a: list[int] | None
    topk_logprobs_a: list[float | None] | None
    topk_ids_b: list[int] | None
    topk_logprobs_b: list[float | None] | None
    len_a: int
    len_b: int
    response_a: str | None = None
    response_b: str | None = None
    target: str | None = None
    kl: float | None = None
    context: str | None = None
    token_text_a: str | None = None
    token_text_b: str | None = None
    topk_texts_a: list[str | None] | None = None
    topk_texts_b: list[str | None] | None = None


class Histogram(Document):
    """Counts per power of ten (``decades``: the exponents), ``zero`` the exact zeros."""

    decades: list[int]
    zero: int
    counts: list[int]


class TokenSummary(Document):
    """Token-level comparison of one task over the samples present on both sides, as
    compare.token_summary builds it (the terms are defined in evalpipe.compare.tokens).

    Non-finite measures (+inf: non-finite logprobs on one side, the largest difference
    there is) are kept as they are in memory, where the gates read them; the file has
    null there (JSON has no infinity)."""

    task: str
    n_samples: int  # paired samples
    only_a: int
    only_b: int
    only_a_keys: list[Key]  # (doc_id, repeat), the first MAX_LISTED_KEYS
    only_b_keys: list[Key]
    n_ids_identical: int
    n_identical: int  # bitwise: ids, logprobs and top-k lists
    n_logprob_diff_same_ids: int  # ids identical, some logprob bits differ
    n_topk_diff_same_ids: int  # ids and logprobs identical, some top-k entry differs
    n_length_diff: int
    tokens_a: int
    tokens_b: int
    n_positions_compared: int  # shared-prefix positions
    n_positions_logprob_diff: int
    divergence_positions: list[int]  # sorted first-divergence positions
    median_first_divergence: float | None
    max_abs_dlogprob: float | None  # over all shared-prefix positions
    mean_abs_dlogprob: float | None
    max_abs_dlogprob_same_ids: float | None  # over samples whose ids are identical
    worst_divergence: list[WorstExample]
    worst_logprob: list[WorstExample]
    # first divergences classified; n_near_tie + n_hard == n_divergent
    near_tie_gap: float | None
    n_near_tie_divergences: int
    n_hard_divergences: int
    hard_divergences: list[Position]  # the first MAX_LISTED_HARD
    # shared-prefix distribution agreement, per position (None when no position compared)
    n_positions_topk_equal: int  # top-k id sets equal (order ignored)
    share_topk_equal: float | None
    kl_p50: float | None  # symmetric max(KL(A||B), KL(B||A)) of the top-k distributions
    kl_p99: float | None
    kl_max: float | None
    abs_dlogprob_p50: float | None  # the max is max_abs_dlogprob
    abs_dlogprob_p99: float | None
    # top-1 agreement over the compared positions; n_top1_hard <= n_top1_disagree
    n_top1_disagree: int
    n_top1_hard: int
    share_top1_agree: float | None
    top1_hard_positions: list[Position]  # the first MAX_LISTED_HARD
    # positions with the largest symmetric KL (> 0 only), ties in key order
    worst_kl: list[WorstExample]
    kl_max_at: Position | None  # where kl_max is; None when kl_max is 0 or None
    # decade histograms over the compared positions
    kl_hist: Histogram
    abs_dlogprob_hist: Histogram
    # derived, for readers that have no compare.tokens
    n_divergent: int  # n_samples - n_ids_identical
    share_ids_identical: float | None
    share_identical: float | None
    identical: bool  # nothing one-sided, every paired sample bitwise identical


# ---------------------------------------------------------------------------
# gates, numerics, distributional tests
# ---------------------------------------------------------------------------


class GateResult(Document):
    """One gate of one task (score gates: of one task x metric), as compare.gates measures it.

    ``aa_value`` is the same measure in the A/A comparison (token gates) or one position's
    A/A spread (distributional gates); ``evidence`` lists item ids / positions ("doc 3
    repeat 0 pos 12") to look at."""

    gate: str
    task: str
    metric: str | None
    status: GateStatus
    measured: float | None
    threshold: float | None
    aa_value: float | None
    detail: str
    evidence: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status is GateStatus.FAIL

    @property
    def finding(self) -> str:
        """The detail without the task, metric and gate it starts with (for a table that shows
        those in columns of their own; the terminal and the reasons keep the whole sentence)."""
        for head in (f"{self.task} {self.metric} {self.gate}:", f"{self.task} {self.gate}:"):
            if self.detail.startswith(head):
                return self.detail[len(head):].strip()
        return self.detail

    @property
    def skipped(self) -> bool:
        return self.status is GateStatus.SKIP


class NumericsDoc(Document):
    """The reference's precision, what the A/A run showed, and the gate floors that follow
    (built by compare.numerics.Numerics, whose rules they are)."""

    dtype: str | None
    source: str
    precision: str
    aa_identical: bool | None
    floors: dict[str, float]


class ShiftTest(Document):
    """One distributional test of one task (evalpipe.compare.distribution). compare computes
    with it as built, NaN where nothing could be measured and +inf for an open interval's
    end; the comparison document holds it as written (those as null: ``as_written``)."""

    test: str
    task: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    p_value: float | None
    n_positions: int
    n_samples: int
    aa_position_sd: float | None  # spread of one position in A/A (dlogprob: sd of lp_A' - lp_A; kl: sd of KL(A, A'))
    n_dropped: int = 0  # positions without a partner in A/A or with a non-finite value


# ---------------------------------------------------------------------------
# paths (evalpipe.compare.code_paths)
# ---------------------------------------------------------------------------


class SideCheck(Document):
    """One variant's records against its expectations (compare.code_paths.check_side)."""

    variant: str
    ok: bool
    verifiable: bool
    failures: tuple[str, ...]
    evidence: tuple[str, ...]
    # task -> those of ``failures`` that are the task's own (its requirements of vLLM's counters)
    task_failures: dict[str, tuple[str, ...]] = {}


class WhatRan(Document):
    """Each side's probe summary (the one its manifest.json keeps); None: not recorded."""

    a: ProbeSummary | None
    b: ProbeSummary | None


class PathStatus(str, Enum):
    VERIFIED = "verified"  # the probes show each side ran the code its config declares
    FAILED = "failed"  # an expectation failed
    SAME_CODE = "same_code"  # both sides ran the same code: nothing was compared
    NOT_RECORDED = "not_recorded"  # a side has no probe record (endpoint mode, an older run)

    def __str__(self) -> str:
        return self.value


VERIFIED: Final = PathStatus.VERIFIED
FAILED: Final = PathStatus.FAILED
SAME_CODE: Final = PathStatus.SAME_CODE
NOT_RECORDED: Final = PathStatus.NOT_RECORDED


class Paths(Document):
    """What ran on each side, judged (compare.code_paths.judge_paths)."""

    status: PathStatus
    reasons: tuple[str, ...]
    checks: tuple[SideCheck, ...]
    same_profile: bool | None
    what_ran: WhatRan

    @property
    def inconclusive(self) -> bool:
        """The paths prove nothing: an expectation failed, a side is unverifiable, or both ran the same code."""
        return self.status in (FAILED, SAME_CODE)


# ---------------------------------------------------------------------------
# per length and depth (evalpipe.compare.bylength)
# ---------------------------------------------------------------------------


class GroupScore(Document):
    metric: str
    binary: bool
    n_paired: int
    n_clusters: int
    n_missing: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None
    se_delta: float | None
    ci_low: float | None
    ci_high: float | None
    ci_conf: float | None
    df: int | None
    mcnemar_p: float | None
    n_changed: int
    a_right_b_wrong: int | None
    a_wrong_b_right: int | None
    changed: list[Key]


class FreeFigures(Document):
    n_samples: int
    n_divergent: int
    n_near_tie_divergences: int
    n_hard_divergences: int
    n_positions: int
    max_abs_dlogprob: float | None
    kl_p99: float | None
    kl_max: float | None


class TeacherFigures(Document):
    n_samples: int
    n_positions: int
    kl_p99: float | None
    kl_max: float | None
    kl_max_at: Position | None
    max_abs_dlogprob: float | None
    n_top1_disagree: int
    n_top1_hard: int


class GroupFigures(Document):
    """Everything measured on one group of items, a length or a depth bin of one task, as
    compare.bylength measures it (its ``_figures`` says what each field holds)."""

    n_items: int
    n_clusters: int
    scores: list[GroupScore]
    free: FreeFigures | None
    teacher: TeacherFigures | None
    teacher_prompt: TeacherFigures | None
    teacher_continuation: TeacherFigures | None


class LengthRow(GroupFigures):
    target_length: int
    length_kind: str | None
    length_tags: str | None
    depths: list[float]


class DepthRow(GroupFigures):
    depth_bin: float
    depth_min: float
    depth_max: float
    lengths: list[int]


class TaskBreakdown(Document):
    task: str
    metrics: list[str]
    has_prompt_positions: bool
    depth_step: float
    lengths: list[LengthRow]
    depths: list[DepthRow]


# ---------------------------------------------------------------------------
# the document
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# sampled decoding (evalpipe.compare.sampling)
# ---------------------------------------------------------------------------


class PassAtK(Document):
    """pass@k of one 0/1 metric, the unbiased estimate per item from its samples, averaged over
    the items on each side; ``delta`` (b − a) with its interval, paired per item."""

    metric: str
    k: int
    items: int
    a: float
    b: float
    delta: float | None
    ci_low: float | None
    ci_high: float | None


class SampledTask(Document):
    """A sampled task's paths under common random numbers: how many samples left the
    reference's path, where, and how many the teacher-forced distributions explain."""

    task: str
    temperature: float
    top_p: float
    top_k: int  # 0: off (as vLLM and the rows have it; `sampler` is the one definition)
    min_p: float
    samples_per_item: int
    items: int
    samples: int  # paired samples compared
    divergent: int  # samples whose token ids differ somewhere
    divergent_rate: float | None
    first_divergence_min: int | None
    first_divergence_median: float | None
    agreeing_positions: int  # sampled positions before each sample's first divergence
    max_abs_dlogprob: float | None  # the sampled tokens' largest |Δlogprob| where the paths agree
    predicted_samples: int  # samples with teacher-forced distributions on both sides
    predicted: float | None  # divergent samples the distributions allow at most (sum of the per-sample bounds)
    excess_p: float | None  # P(at least `divergent` divergent samples | those bounds); None: not every sample predicted
    tv_max: float | None  # the largest total variation between the sampling distributions at a forced position
    pass_at: list[PassAtK]

    @property
    def sampler(self) -> Sampler:
        """The task's sampler (evalpipe.config.sampling.Sampler: its describe() is the one wording)."""
        return Sampler.recorded(self.temperature, self.top_p, self.top_k, self.min_p)


class TaskVerdict(Document):
    """One task of a comparison judged on its own evidence (compare.task_verdicts): a scenario's
    verdict of the path it drives."""

    task: str
    status: Status
    reasons: list[str]
    outputs_status: Status | None  # INCONCLUSIVE: what the task's outputs alone said
    gates_failed: int
    gates_passed: int


class SampleCounts(Document):
    a: int
    b: int


class Comparison(Document):
    """Reference (a) against one variant (b)."""

    a: str
    b: str
    reference: str
    variant: str
    status: Status
    reasons: list[str]
    samples: SampleCounts
    scores: list[ScoreRow]
    metrics_only_a: list[str]
    metrics_only_b: list[str]
    tokens: list[TokenSummary]
    teacher: list[TokenSummary] | None  # None: teacher.parquet missing on a side
    gates: list[GateResult]
    numerics: NumericsDoc
    distribution: list[ShiftTest] | None  # None: no A/A run or no teacher-forced data
    outputs_status: Status | None  # INCONCLUSIVE: what the outputs alone said
    paths: Paths | None  # None: a bare table comparison (not judged)
    # long-context tasks only; other runs' files have no such key
    by_length: list[TaskBreakdown] | None = Field(default=None, exclude_if=lambda v: v is None)
    # sampled tasks only (config `sampling:`); greedy runs' files have no such key
    sampling: list[SampledTask] | None = Field(default=None, exclude_if=lambda v: v is None)
    # each task's own verdict (None: a file from before task verdicts)
    tasks: list[TaskVerdict] | None = Field(default=None, exclude_if=lambda v: v is None)
    # the sides compared without their manifest.json (`evalpipe compare --unverified`; the A/A
    # variant too when it bounded the gates): the status is then INCONCLUSIVE. Verified
    # comparisons have no such key
    unverified: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)

    @property
    def paths_inconclusive(self) -> bool:
        """The paths prove nothing (see Paths.inconclusive)."""
        return self.paths is not None and self.paths.inconclusive

    @property
    def path_reasons(self) -> list[str]:
        return list(self.paths.reasons) if self.paths is not None else []

    @property
    def unverified_only(self) -> bool:
        """INCONCLUSIVE only because a side was compared without its manifest (its paths say nothing against it)."""
        return bool(self.unverified) and not self.paths_inconclusive


class ComparisonDocument(Document):
    schema_version: Literal[3] = COMPARE_SCHEMA_VERSION
    run_id: str
    reference: str
    variants: list[str]
    status: Status
    gates: Gates
    noise_floor: Comparison | None  # the A/A comparison, not in the status
    comparisons: list[Comparison]
    # every variant compared without its manifest.json (`evalpipe compare --unverified`);
    # a verified run's file has no such key
    unverified: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)

    def judged_entries(self) -> list[tuple[Comparison, bool]]:
        """(comparison, is the A/A one): the comparisons, then the noise floor."""
        nf = self.noise_floor
        return [(c, False) for c in self.comparisons] + ([(nf, True)] if nf is not None else [])

    def inconclusive_variants(self) -> list[str]:
        """The variants whose paths prove nothing (INCONCLUSIVE for another reason than being compared unverified)."""
        return [c.variant for c in self.comparisons if c.status == Status.INCONCLUSIVE and not c.unverified_only]

    def gate_counts(self) -> dict[str, int]:
        """Gates of the comparisons (the A/A one not included) by status, and their total."""
        counts = {"total": 0, **{s.value: 0 for s in GateStatus}}
        for c in self.comparisons:
            for g in c.gates:
                counts["total"] += 1
                counts[g.status.value] += 1
        return counts


def comparison_json(doc: ComparisonDocument) -> str:
    """The text of compare.json: sorted keys, two-space indent, NaN and infinities as null
    (pydantic's JSON mode writes them so; its dict mode keeps them)."""
    return json.dumps(json.loads(doc.model_dump_json()), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_comparison(path: Path, doc: ComparisonDocument) -> None:
    write_text(path, comparison_json(doc))


def read_comparison(path: Path) -> ComparisonDocument:
    remedy = f"re-run `evalpipe compare {path.parent}` to rewrite it"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path} cannot be read as a comparison ({err}); {remedy}.") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != COMPARE_SCHEMA_VERSION:
        age = "an older" if isinstance(version, int) and version < COMPARE_SCHEMA_VERSION else "another"
        raise UserError(f"{path} was written by {age} evalpipe (schema {version}); {remedy}.")
    return validated(ComparisonDocument, raw, str(path), remedy)
