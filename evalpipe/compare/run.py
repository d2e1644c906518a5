"""Compare the variants of a run directory and write compare.json / report.md.

``compare.json`` is a pure function of the artifacts (and the gates): no timestamps,
no absolute paths, sorted keys, NaN as null; recomputing it from the same run
directory gives the same bytes.

Noise floor: when run.json names an A/A run (``"noise_floor": {"variant":
"<reference>-aa"}``), the reference is compared with it first. That comparison is
information, not a verdict: it is left out of the run status and of the variant
list, and its token measures set the relative bounds of every other comparison's
gates (see :mod:`evalpipe.compare.gates`).

Teacher forcing: ``<variant>/teacher.parquet`` holds the reference's continuations
scored by that variant. When both sides have one, it is compared with the same
token comparison as the free-running tokens; the ids agree by construction, so
every position is on the shared prefix and the per-position measures (KL, top-1)
cover the whole continuation.

Long-context tasks: when the samples carry ``target_length`` (tasks/longctx), each
comparison (the A/A one included) also gets ``by_length``, its scores and token
figures per task x prompt length and needle depth (:mod:`evalpipe.compare.bylength`);
compare.json of other runs has no such key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
from pydantic import ValidationError

from evalpipe import artifacts
from evalpipe.artifacts import SAMPLE_KEY, TOKENS_REQUIRED, RunDir, VariantDir
from evalpipe.compare.bylength import LengthBreakdown, length_breakdown
from evalpipe.compare.distribution import PositionValues, ShiftTest, shift_tests
from evalpipe.compare.gates import AASummaries
from evalpipe.compare.numerics import Numerics, numerics_from_engine_args
from evalpipe.compare.scores import ScoreComparison, compare_scores, to_jsonable
from evalpipe.compare.tokens import TokenComparison, compare_tokens
from evalpipe.compare.verdict import Status, Verdict, decide, worst_status
from evalpipe.config import Gates, aa_variant_name

# Bump when the layout of compare.json changes incompatibly.
COMPARE_SCHEMA_VERSION = 2

_SAMPLES_REQUIRED = SAMPLE_KEY
_TOKENS_REQUIRED = TOKENS_REQUIRED


@dataclass(frozen=True)
class VariantComparison:
    """Reference (side A) vs one variant (side B). Field suffixes _a/_b follow that order."""

    reference: str
    variant: str
    n_samples_a: int
    n_samples_b: int
    scores: ScoreComparison
    tokens: TokenComparison
    verdict: Verdict
    teacher: TokenComparison | None = None  # None: teacher.parquet missing on a side
    # per task, length and needle depth; None unless the samples carry target_length
    by_length: LengthBreakdown | None = None
    numerics: Numerics = Numerics()
    shifts: tuple[ShiftTest, ...] | None = None  # distributional tests; None without A/A or teacher data

    @property
    def status(self) -> Status:
        return self.verdict.status

    def aa_summaries(self) -> AASummaries:
        """This comparison's token summaries, as the A/A noise floor of other comparisons."""
        teacher = None if self.teacher is None else self.teacher.summaries
        return AASummaries.of(self.tokens.summaries, teacher)

    def to_dict(self) -> dict[str, Any]:
        # "by_length" only for runs with long-context tasks: other runs' compare.json keeps its keys
        extra = {} if self.by_length is None else {"by_length": self.by_length.to_dict()}
        return to_jsonable(
            {
                **extra,
                "a": self.reference,
                "b": self.variant,
                "reference": self.reference,
                "variant": self.variant,
                "status": self.verdict.status.value,
                "reasons": list(self.verdict.reasons),
                "samples": {"a": self.n_samples_a, "b": self.n_samples_b},
                "scores": [r.to_dict() for r in self.scores.rows],
                "metrics_only_a": list(self.scores.metrics_only_a),
                "metrics_only_b": list(self.scores.metrics_only_b),
                "tokens": [t.to_dict() for t in self.tokens.summaries],
                "teacher": None if self.teacher is None else [t.to_dict() for t in self.teacher.summaries],
                "gates": [g.to_dict() for g in self.verdict.gates],
                "numerics": self.numerics.to_dict(),
                "distribution": None if self.shifts is None else [t.to_dict() for t in self.shifts],
            }
        )


@dataclass(frozen=True)
class RunComparison:
    """The reference against every variant; ``noise_floor`` is the A/A comparison (not in the status)."""

    run_id: str
    reference: str
    comparisons: tuple[VariantComparison, ...]
    noise_floor: VariantComparison | None = None
    gates: Gates = Gates()

    @property
    def status(self) -> Status:
        return worst_status(c.status for c in self.comparisons)

    @property
    def variants(self) -> list[str]:
        return [c.variant for c in self.comparisons]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": COMPARE_SCHEMA_VERSION,
            "run_id": self.run_id,
            "reference": self.reference,
            "variants": self.variants,
            "status": self.status.value,
            "gates": self.gates.model_dump(mode="json"),
            "noise_floor": None if self.noise_floor is None else self.noise_floor.to_dict(),
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    def to_json(self) -> str:
        """Exactly the text artifacts.write_json writes for compare.json."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def _where(vdir: VariantDir) -> str:
    return str(vdir.root.parent)


def _read(vdir: VariantDir, path: Path, required: Sequence[str]) -> pa.Table:
    if not vdir.root.is_dir():
        raise ValueError(f"variant {vdir.name!r} has no directory in {_where(vdir)}; was it part of this run?")
    if not path.is_file():
        raise ValueError(f"variant {vdir.name!r} in {_where(vdir)} has no {path.name}; did its run finish?")
    try:
        table = artifacts.read_table(path)
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise ValueError(f"{path} cannot be read as Parquet ({exc}); re-run variant {vdir.name!r}.") from exc
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}; it was written by an incompatible evalpipe version.")
    return table


def load_variant(vdir: VariantDir) -> tuple[pa.Table, pa.Table]:
    """(samples, tokens) of a variant directory, with a one-sentence ValueError if absent."""
    samples = _read(vdir, vdir.samples, _SAMPLES_REQUIRED)
    tokens = _read(vdir, vdir.tokens, _TOKENS_REQUIRED)
    return samples, tokens


def load_teacher(vdir: VariantDir) -> pa.Table | None:
    """teacher.parquet of a variant, or None when it has none (teacher forcing is optional)."""
    return _read(vdir, vdir.teacher, _TOKENS_REQUIRED) if vdir.teacher.is_file() else None


@dataclass(frozen=True, eq=False)
class VariantArtifacts:
    """The artifacts of one variant, loaded once per run comparison."""

    name: str
    samples: pa.Table
    tokens: pa.Table
    teacher: pa.Table | None

    @classmethod
    def load(cls, vdir: VariantDir, name: str | None = None) -> "VariantArtifacts":
        samples, tokens = load_variant(vdir)
        return cls(name or vdir.name, samples, tokens, load_teacher(vdir))


# ---------------------------------------------------------------------------
# comparing
# ---------------------------------------------------------------------------


def with_margin(gates: Gates | None, margin: float | None) -> Gates:
    """``gates`` (default Gates()) with the score margin replaced when ``margin`` is given."""
    gates = Gates() if gates is None else gates
    if margin is None:
        return gates
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
) -> VariantComparison:
    """Score + token comparison, gates and verdict of two in-memory variants (A = reference).

    The score statistics use the gates' margin and alpha, so the score gates read
    them straight off the rows; ``margin`` overrides ``gates.scores.margin``. The
    teacher-forced tables are compared only when both are given, without the samples
    tables: their sample set is the samples that have teacher-forced positions.
    ``aa`` is the A/A comparison whose values set the gates' relative bounds and
    against which the distributional tests run; ``numerics`` the reference's precision
    (None: unknown, the half-precision floors apply).
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
    )
    return VariantComparison(
        reference=label_a,
        variant=label_b,
        n_samples_a=samples_a.num_rows,
        n_samples_b=samples_b.num_rows,
        scores=scores,
        tokens=tokens,
        verdict=verdict,
        teacher=teacher,
        by_length=by_length,
        numerics=numerics,
        shifts=None if shifts is None else tuple(shifts),
    )


def _aa_identical(aa: VariantComparison | None) -> bool | None:
    """Whether the A/A run reproduced the reference bitwise where the distributional gates
    look: at the teacher-forced positions (the whole A/A when it has none). A deterministic
    prefill with noisy decoding (batch shapes) counts as identical here."""
    if aa is None:
        return None
    if aa.teacher is not None:
        return all(t.identical for t in aa.teacher.summaries)
    return aa.status is Status.IDENTICAL


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
    )


def compare_variants(
    a: VariantDir,
    b: VariantDir,
    *,
    label_a: str | None = None,
    label_b: str | None = None,
    worst_k: int = 5,
    margin: float | None = None,
    gates: Gates | None = None,
    aa: VariantComparison | None = None,
) -> VariantComparison:
    """Compare variant ``b`` against reference ``a`` from their artifacts (teacher.parquet included).

    Labels default to the directory names; pass e.g. "runA/legacy" when comparing
    across runs where both directories have the same name.
    """
    return compare_artifacts(
        VariantArtifacts.load(a, label_a), VariantArtifacts.load(b, label_b), worst_k=worst_k, gates=with_margin(gates, margin), aa=aa
    )


def variant_numerics(vdir: VariantDir) -> Numerics:
    """The precision a variant ran in, from the engine arguments its manifest records."""
    where = f"{vdir.name}/manifest.json"
    try:
        manifest = artifacts.read_json(vdir.manifest) if vdir.manifest.is_file() else {}
    except (OSError, ValueError):
        manifest = {}
    args = manifest.get("engine_args") if isinstance(manifest, dict) else None
    return numerics_from_engine_args(args if isinstance(args, dict) else None, where)


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """Parsed run.json, or {} when the run directory has none."""
    path = RunDir(run_dir).run_json
    if not path.is_file():
        return {}
    try:
        info = artifacts.read_json(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); restore or delete it.") from exc
    if not isinstance(info, dict):
        raise ValueError(f"{path} should hold a JSON object; restore or delete it.")
    return info


def variant_names_from_info(run_info: dict[str, Any]) -> list[str] | None:
    """Variant names from run.json's "variants": a list of names, of {"name": ...} objects, or a mapping."""
    v = run_info.get("variants")
    if isinstance(v, dict):
        return [str(k) for k in v]
    if isinstance(v, list):
        names = []
        for item in v:
            if isinstance(item, str):
                names.append(item)
            elif isinstance(item, dict) and item.get("name"):
                names.append(str(item["name"]))
        return names or None
    return None


def gates_from_info(run_info: dict[str, Any], where: str = "run.json") -> Gates:
    """The gates of run.json's "config"."gates", else the defaults; ``where`` names the file in errors."""
    config = run_info.get("config")
    data = config.get("gates") if isinstance(config, dict) else None
    if data is None:
        return Gates()
    try:
        return Gates.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: config.gates.{key}: {first['msg']}; fix or remove it.") from None


def noise_floor_from_info(run_info: dict[str, Any], reference: str) -> str | None:
    """The A/A variant of ``reference`` that run.json names, else None.

    An A/A run of another variant (the reference was overridden) is no noise floor
    for this reference; it is then compared like any variant.
    """
    nf = run_info.get("noise_floor")
    name = nf.get("variant") if isinstance(nf, dict) else None
    return str(name) if name and str(name) == aa_variant_name(reference) else None


def compare_run(
    run_dir: Path,
    reference: str | None = None,
    variants: list[str] | None = None,
    *,
    worst_k: int = 5,
    margin: float | None = None,
    gates: Gates | None = None,
) -> RunComparison:
    """Compare every non-reference variant of ``run_dir`` with the reference.

    Defaults: reference = run.json "reference" (else the first variant); variants =
    run.json "variants" (else every sub-directory with a manifest.json); gates =
    run.json "config"."gates" (else the defaults). With a noise floor in run.json the
    A/A comparison runs first and bounds the others (module docstring).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist.")
    rd = RunDir(run_dir)
    info = read_run_info(run_dir)
    gates = with_margin(gates if gates is not None else gates_from_info(info, str(rd.run_json)), margin)
    names = list(variants) if variants else (variant_names_from_info(info) or rd.variant_names())
    if not names:
        raise ValueError(f"{run_dir} has no variants (no run.json \"variants\" and no <variant>/manifest.json).")
    ref = str(reference or info.get("reference") or names[0])
    aa_name = noise_floor_from_info(info, ref)
    others = [n for n in dict.fromkeys(names) if n not in (ref, aa_name)]
    if not others:
        raise ValueError(f"{run_dir} has only the reference variant {ref!r}; there is nothing to compare it with.")
    ref_side = VariantArtifacts.load(rd.variant(ref))
    numerics = variant_numerics(rd.variant(ref))
    aa = None
    if aa_name is not None:
        aa_side = VariantArtifacts.load(rd.variant(aa_name))
        aa = compare_artifacts(ref_side, aa_side, worst_k=worst_k, gates=gates, numerics=numerics)
    comparisons = tuple(
        compare_artifacts(ref_side, VariantArtifacts.load(rd.variant(name)), worst_k=worst_k, gates=gates, aa=aa, numerics=numerics)
        for name in others
    )
    run_id = str(info.get("run_id") or run_dir.name)
    return RunComparison(run_id=run_id, reference=ref, comparisons=comparisons, noise_floor=aa, gates=gates)


def write_outputs(
    run_dir: Path, run_comparison: RunComparison, run_info: dict[str, Any] | None = None
) -> dict[str, Path]:
    """Write compare.json, report.md, report.html and junit.xml atomically.

    compare.json is written first: the reports are renderings of it, so a failure
    while drawing a plot never loses the comparison itself."""
    from evalpipe.report import render_html, render_junit, render_markdown  # report depends on compare

    rd = RunDir(Path(run_dir))
    if run_info is None:
        run_info = read_run_info(rd.root)
    data = run_comparison.to_dict()
    artifacts.write_json(rd.compare_json, data)
    artifacts.write_text(rd.junit_xml, render_junit(data))
    artifacts.write_text(rd.report_md, render_markdown(data, run_info))
    artifacts.write_text(rd.report_html, render_html(data, run_info))
    return {"compare": rd.compare_json, "junit": rd.junit_xml, "markdown": rd.report_md, "html": rd.report_html}


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
        raise ValueError(
            f"{label_a} ran tasks {sorted(a)} but {label_b} ran {sorted(b)}; compare runs of the same tasks."
        )
    for task in sorted(a):
        if set(a[task]) != set(b[task]):
            raise ValueError(
                f"task {task}: {label_a} has {len(a[task])} items and {label_b} has {len(b[task])}, "
                "not the same documents; re-run with the same tasks and --limit."
            )
        differing = sorted(k for k in a[task] if a[task][k] != b[task][k])
        if differing:
            doc, rep = differing[0]
            raise ValueError(
                f"task {task}: {len(differing)} items have different prompts in {label_a} and {label_b} "
                f"(first: doc {doc}, repeat {rep}); the task definition or its data changed between the runs."
            )


def compare_across_runs(
    a: Path, b: Path, *, worst_k: int = 5, margin: float | None = None, gates: Gates | None = None
) -> RunComparison:
    """`evalpipe compare RUN_A/VARIANT RUN_B/VARIANT`: B against A as reference.

    Gates default to those of run A's run.json. There is no noise floor: an A/A run
    belongs to one run, and two runs need not share their engine settings.
    """
    va, vb = VariantDir(Path(a)), VariantDir(Path(b))
    label_a, label_b = f"{va.root.parent.name}/{va.name}", f"{vb.root.parent.name}/{vb.name}"
    if label_a == label_b:
        label_a, label_b = str(va.root), str(vb.root)
    if gates is None:
        run_a = RunDir(va.root.parent)
        gates = gates_from_info(read_run_info(run_a.root), str(run_a.run_json))
    gates = with_margin(gates, margin)
    side_a, side_b = VariantArtifacts.load(va, label_a), VariantArtifacts.load(vb, label_b)
    check_same_items(side_a.samples, side_b.samples, label_a, label_b)
    vc = compare_artifacts(side_a, side_b, worst_k=worst_k, gates=gates, numerics=variant_numerics(va))
    return RunComparison(run_id=f"{label_a} vs {label_b}", reference=label_a, comparisons=(vc,), gates=gates)
