"""The comparison of a run's variants, over in-memory tables: no file is read or written here.

:func:`compare_tables` / :func:`compare_artifacts` compare a variant with the
reference (A) into a :class:`VariantComparison`; a :class:`RunComparison` holds the
reference against every variant and serializes to compare.json. Reading a run
directory's artifacts and run.json and writing compare.json and the reports is
:mod:`evalpipe.pipeline.comparing`; the reports themselves are :mod:`evalpipe.report`.

``compare.json`` is a pure function of the artifacts (and the gates): no timestamps,
no absolute paths, sorted keys, NaN as null; recomputing it from the same run
directory gives the same bytes.

Noise floor: a comparison given ``aa`` (the reference against its A/A run) uses it
as information, not a verdict: the A/A comparison is left out of the run status and
of the variant list, and its token measures set the relative bounds of every other
comparison's gates (see :mod:`evalpipe.compare.gates`).

Teacher forcing: the teacher tables (``<variant>/teacher.parquet``) hold the
reference's continuations scored by that variant. When both sides have one, they are
compared with the same token comparison as the free-running tokens; the ids agree by
construction, so every position is on the shared prefix and the per-position measures
(KL, top-1) cover the whole continuation.

Long-context tasks: when the samples carry ``target_length`` (tasks/longctx), each
comparison (the A/A one included) also gets ``by_length``, its scores and token
figures per task x prompt length and needle depth (:mod:`evalpipe.compare.bylength`);
compare.json of other runs has no such key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import pyarrow as pa

from evalpipe.compare.bylength import length_breakdown
from evalpipe.compare.code_paths import PathSide, VariantProbes, judge_paths
from evalpipe.compare.distribution import PositionValues, shift_tests
from evalpipe.compare.gates import AASummaries
from evalpipe.compare.numerics import Numerics
from evalpipe.compare.sampling import reproducibility_problem, sampled_tasks
from evalpipe.compare.scores import ScoreComparison, compare_scores
from evalpipe.compare.task_verdicts import task_verdicts
from evalpipe.compare.tokens import TokenComparison, compare_tokens
from evalpipe.compare.verdict import Verdict, decide, unverified_reason, worst_status
from evalpipe.config.expectations import Expectations
from evalpipe.config.gate_settings import Gates, margin_problem
from evalpipe.documents import comparison as schema
from evalpipe.documents.base import as_written
from evalpipe.documents.comparison import ShiftTest, Status
from evalpipe.documents.manifest import EngineCounters
from evalpipe.errors import UserError


@dataclass(frozen=True)
class VariantComparison:
    """Reference (side A) vs one variant (side B): ``doc``, the comparison as compare.json holds
    it (built with the comparison), beside what the file cannot hold: the per-item and
    per-position arrays and the in-memory measures (+inf, NaN) that the A/A bounds, the
    distributional tests and calibration compute with."""

    doc: schema.Comparison
    scores: ScoreComparison
    tokens: TokenComparison
    verdict: Verdict
    teacher: TokenComparison | None = None  # None: teacher.parquet missing on a side
    shifts: tuple[ShiftTest, ...] | None = None  # distributional tests; None without A/A or teacher data
    numerics: Numerics = Numerics()  # the reference's precision: the gates' floors

    @property
    def reference(self) -> str:
        return self.doc.reference

    @property
    def variant(self) -> str:
        return self.doc.variant

    @property
    def status(self) -> Status:
        return self.doc.status

    @property
    def by_length(self) -> list[schema.TaskBreakdown] | None:
        """Per task, length and needle depth; None unless the samples carry target_length."""
        return self.doc.by_length

    @property
    def paths(self) -> schema.Paths | None:
        """What ran on each side, judged (None: not asked, a bare table comparison)."""
        return self.doc.paths

    @property
    def unverified(self) -> tuple[str, ...]:
        """The sides read without a manifest (`compare --unverified`), the A/A run's when it set the bounds."""
        return tuple(self.doc.unverified or ())

    def aa_summaries(self) -> AASummaries:
        """This comparison's token summaries, as the A/A noise floor of other comparisons."""
        teacher = None if self.teacher is None else self.teacher.summaries
        return AASummaries.of(self.tokens.summaries, teacher)


@dataclass(frozen=True)
class RunComparison:
    """The reference against every variant: ``doc``, compare.json's document, and the comparisons
    behind its entries; ``noise_floor`` is the A/A comparison (not in the status)."""

    doc: schema.ComparisonDocument
    comparisons: tuple[VariantComparison, ...]
    noise_floor: VariantComparison | None = None

    @classmethod
    def of(cls, run_id: str, reference: str, comparisons: tuple[VariantComparison, ...],
           noise_floor: VariantComparison | None = None, gates: Gates | None = None) -> RunComparison:
        every = [c.unverified for c in (noise_floor, *comparisons) if c is not None]
        unverified = list(dict.fromkeys(name for names in every for name in names))  # in the order the comparisons name them
        doc = schema.ComparisonDocument(
            run_id=run_id,
            reference=reference,
            variants=[c.variant for c in comparisons],
            status=worst_status(c.status for c in comparisons),
            gates=Gates() if gates is None else gates,
            noise_floor=None if noise_floor is None else noise_floor.doc,
            comparisons=[c.doc for c in comparisons],
            unverified=unverified or None,
        )
        return cls(doc, comparisons, noise_floor)

    @property
    def status(self) -> Status:
        return self.doc.status

    def to_json(self) -> str:
        """Exactly the text compare.json holds."""
        return schema.comparison_json(self.doc)


@dataclass(frozen=True, eq=False)
class VariantArtifacts:
    """The artifacts of one variant, loaded once per run comparison (:func:`evalpipe.pipeline.comparing.load_artifacts`)."""

    name: str
    samples: pa.Table
    tokens: pa.Table
    teacher: pa.Table | None
    probes: VariantProbes | None = None  # None: the run predates path probes
    expect: Expectations | None = None
    verified: bool = True  # False: read without its manifest (`compare --unverified`)
    counters: Mapping[str, EngineCounters] | None = None  # task -> vLLM's counters over it (the manifest's)

    @property
    def path_side(self) -> PathSide:
        return PathSide(self.name, self.expect, self.probes, self.counters)


# ---------------------------------------------------------------------------
# comparing
# ---------------------------------------------------------------------------


def with_margin(gates: Gates | None, margin: float | None) -> Gates:
    """``gates`` (default Gates()) with the score margin replaced when ``margin`` is given."""
    gates = Gates() if gates is None else gates
    if margin is None:
        return gates
    if problem := margin_problem(margin):  # model_copy validates nothing
        raise UserError(f"the score margin {problem}.")
    return gates.model_copy(update={"scores": gates.scores.model_copy(update={"margin": margin})})


def compare_tables(
    samples_a: pa.Table,
    tokens_a: pa.Table,
    samples_b: pa.Table,
    tokens_b: pa.Table,
    *,
    label_a: str = "A",
    label_b: str = "B",
    worst_k: int = 5,
    margin: float | None = None,
    teacher_a: pa.Table | None = None,
    teacher_b: pa.Table | None = None,
    gates: Gates | None = None,
    aa: VariantComparison | None = None,
    numerics: Numerics | None = None,
    paths: tuple[PathSide, PathSide] | None = None,
    unverified: Sequence[str] = (),
) -> VariantComparison:
    """Score + token comparison, gates and verdict of two in-memory variants (A = reference).

    The score statistics use the gates' margin and alpha, so the score gates read
    them straight off the rows; ``margin`` overrides ``gates.scores.margin``. The
    teacher-forced tables are compared only when both are given, without the samples
    tables: their sample set is the samples that have teacher-forced positions.
    ``aa`` is the A/A comparison whose values set the gates' relative bounds and
    against which the distributional tests run; ``numerics`` the reference's precision
    (None: unknown, the half-precision floors apply); ``paths`` what each side's probes
    recorded and its expectations (None: not judged), which may make the verdict INCONCLUSIVE;
    ``unverified`` the sides read without their manifest, which makes it INCONCLUSIVE (so does
    an A/A comparison with such a side: its figures bound the gates).
    """
    gates = with_margin(gates, margin)
    numerics = (numerics or Numerics()).with_aa(_aa_identical(aa))
    scores = compare_scores(samples_a, samples_b, margin=gates.scores.margin, alpha=gates.scores.alpha)
    tokens = compare_tokens(tokens_a, tokens_b, samples_a, samples_b, worst_k=worst_k)
    teacher = None
    if teacher_a is not None and teacher_b is not None:
        teacher = compare_tokens(teacher_a, teacher_b, worst_k=worst_k)
    # per task x length / depth of the long-context tasks (None at once for other runs)
    by_length = length_breakdown(
        samples_a, samples_b, scores, tokens, teacher, margin=gates.scores.margin, alpha=gates.scores.alpha
    )
    shifts, shift_missing = _shift_tests(teacher, aa, gates)
    sampled = sampled_tasks(samples_a, samples_b, tokens, teacher, teacher_a, teacher_b)
    aa_sampled = None if aa is None else aa.doc.sampling
    verdict = decide(
        scores.rows,
        tokens.summaries,
        teacher_summaries=None if teacher is None else teacher.summaries,
        gates=gates,
        aa=None if aa is None else aa.aa_summaries(),
        metrics_only_a=scores.metrics_only_a,
        metrics_only_b=scores.metrics_only_b,
        label_a=repr(label_a),
        label_b=repr(label_b),
        numerics=numerics,
        shift_tests=shifts,
        shift_missing=shift_missing,
        sampled=sampled,
        aa_sampled=aa_sampled,
    )
    unreproducible = None if aa_sampled is None else reproducibility_problem(aa_sampled, gates.sampling.alpha)
    if unreproducible is not None:  # the seeds did not make the A/A run repeat itself: no sampled path proves anything
        verdict = verdict.with_paths(True, [unreproducible])
    judged = None
    if paths is not None:
        judged = judge_paths(paths[0], paths[1], outputs_identical=verdict.status is Status.IDENTICAL)
        verdict = verdict.with_paths(judged.inconclusive, judged.reasons)
    unread = tuple(dict.fromkeys([*unverified, *(aa.unverified if aa is not None else ())]))
    verdict = verdict.unverified(unread)
    per_task = task_verdicts(
        scores.rows, tokens.summaries, teacher_summaries=None if teacher is None else teacher.summaries, gates=gates,
        aa=None if aa is None else aa.aa_summaries(), numerics=numerics, shift_tests=shifts, shift_missing=shift_missing,
        sampled=sampled, aa_sampled=aa_sampled, paths=judged,
        shared_reasons=[*([unreproducible] if unreproducible else []), *([unverified_reason(unread)] if unread else [])],
    )
    doc = schema.Comparison(
        a=label_a,
        b=label_b,
        reference=label_a,
        variant=label_b,
        status=verdict.status,
        reasons=list(verdict.reasons),
        samples=schema.SampleCounts(a=samples_a.num_rows, b=samples_b.num_rows),
        # the measures as the file holds them (non-finite as null); the gates had them as computed
        scores=[as_written(r) for r in scores.rows],
        metrics_only_a=list(scores.metrics_only_a),
        metrics_only_b=list(scores.metrics_only_b),
        tokens=[as_written(t) for t in tokens.summaries],
        teacher=None if teacher is None else [as_written(t) for t in teacher.summaries],
        gates=list(verdict.gates),
        numerics=numerics.doc,
        distribution=None if shifts is None else [as_written(t) for t in shifts],
        outputs_status=verdict.outputs,
        paths=judged,
        by_length=None if by_length is None else [as_written(t) for t in by_length],
        sampling=None if sampled is None else [as_written(t) for t in sampled],
        tasks=per_task,
        unverified=list(unread) or None,
    )
    return VariantComparison(doc, scores, tokens, verdict, teacher, None if shifts is None else tuple(shifts), numerics)


def _aa_identical(aa: VariantComparison | None) -> bool | None:
    """Whether the A/A run reproduced the reference bitwise where the distributional gates
    look: at the teacher-forced positions (the whole A/A when it has none). A deterministic
    prefill with noisy decoding (batch shapes) counts as identical here."""
    if aa is None:
        return None
    if aa.teacher is not None:
        return all(t.identical for t in aa.teacher.summaries)
    return (aa.verdict.outputs or aa.status) is Status.IDENTICAL  # what the outputs said, whatever the paths did


def _shift_tests(
    teacher: TokenComparison | None, aa: VariantComparison | None, gates: Gates
) -> tuple[list[ShiftTest] | None, str | None]:
    """The distributional tests of a comparison against its A/A one, or (None, why not)."""
    if aa is None:
        return None, "no A/A run: these gates compare the A/B distribution with the A/A one (noise_floor: true)"
    if teacher is None or aa.teacher is None:
        return None, "no teacher-forced data on both sides and in the A/A run (capture.teacher_forcing: true)"
    ab_values, aa_values = PositionValues.of(teacher), PositionValues.of(aa.teacher)
    if ab_values is None or aa_values is None:
        return None, "the teacher-forced comparison kept no per-position values"
    return shift_tests(ab_values, aa_values, gates.distribution.confidence), None


def compare_artifacts(
    a: VariantArtifacts,
    b: VariantArtifacts,
    *,
    worst_k: int,
    gates: Gates,
    aa: VariantComparison | None = None,
    numerics: Numerics | None = None,
) -> VariantComparison:
    return compare_tables(
        a.samples,
        a.tokens,
        b.samples,
        b.tokens,
        label_a=a.name,
        label_b=b.name,
        worst_k=worst_k,
        teacher_a=a.teacher,
        teacher_b=b.teacher,
        gates=gates,
        aa=aa,
        numerics=numerics,
        paths=(a.path_side, b.path_side),
        unverified=[side.name for side in (a, b) if not side.verified],
    )


# ---------------------------------------------------------------------------
# across runs
# ---------------------------------------------------------------------------


def _item_keys(samples: pa.Table) -> dict[str, dict[tuple[int, int], str]]:
    cols = samples.select(["task", "doc_id", "repeat", "prompt_hash"]).to_pydict()
    out: dict[str, dict[tuple[int, int], str]] = {}
    for task, doc, rep, h in zip(cols["task"], cols["doc_id"], cols["repeat"], cols["prompt_hash"]):
        out.setdefault(task, {})[(int(doc), int(rep))] = h
    return out


def check_same_items(samples_a: pa.Table, samples_b: pa.Table, label_a: str, label_b: str) -> None:
    """Variants of two different runs are comparable only on the same items with the
    same prompts; raise a one-sentence ValueError naming the first mismatch."""
    a, b = _item_keys(samples_a), _item_keys(samples_b)
    if set(a) != set(b):
        raise UserError(
            f"{label_a} ran tasks {sorted(a)} but {label_b} ran {sorted(b)}; compare runs of the same tasks."
        )
    for task in sorted(a):
        if set(a[task]) != set(b[task]):
            raise UserError(
                f"task {task}: {label_a} has {len(a[task])} items and {label_b} has {len(b[task])}, "
                "not the same documents; re-run with the same tasks and --limit."
            )
        differing = sorted(k for k in a[task] if a[task][k] != b[task][k])
        if differing:
            doc, rep = differing[0]
            raise UserError(
                f"task {task}: {len(differing)} items have different prompts in {label_a} and {label_b} "
                f"(first: doc {doc}, repeat {rep}); the task definition or its data changed between the runs."
            )
