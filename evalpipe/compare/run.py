"""Compare the variants of a run directory and write compare.json / report.md.

``compare.json`` is a pure function of the artifacts: no timestamps, no absolute
paths, sorted keys, NaN as null; recomputing it from the same run directory gives
the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from evalpipe import artifacts
from evalpipe.artifacts import SAMPLE_KEY, TOKENS_REQUIRED, RunDir, VariantDir
from evalpipe.compare.scores import DEFAULT_MARGIN, ScoreComparison, compare_scores, to_jsonable
from evalpipe.compare.tokens import TokenComparison, compare_tokens
from evalpipe.compare.verdict import Status, Verdict, decide, worst_status

# Bump when the layout of compare.json changes incompatibly.
COMPARE_SCHEMA_VERSION = 1

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

    @property
    def status(self) -> Status:
        return self.verdict.status

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(
            {
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
            }
        )


@dataclass(frozen=True)
class RunComparison:
    run_id: str
    reference: str
    comparisons: tuple[VariantComparison, ...]

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


# ---------------------------------------------------------------------------
# comparing
# ---------------------------------------------------------------------------


def compare_tables(
    samples_a: pa.Table,
    tokens_a: pa.Table,
    samples_b: pa.Table,
    tokens_b: pa.Table,
    *,
    label_a: str = "A",
    label_b: str = "B",
    worst_k: int = 5,
    margin: float = DEFAULT_MARGIN,
) -> VariantComparison:
    """Score + token comparison and verdict of two in-memory variants (A = reference).

    ``margin``: TOST equivalence margin of the score statistics (metric scale).
    """
    scores = compare_scores(samples_a, samples_b, margin=margin)
    tokens = compare_tokens(tokens_a, tokens_b, samples_a, samples_b, worst_k=worst_k)
    verdict = decide(
        scores.rows,
        tokens.summaries,
        metrics_only_a=scores.metrics_only_a,
        metrics_only_b=scores.metrics_only_b,
        label_a=repr(label_a),
        label_b=repr(label_b),
    )
    return VariantComparison(
        reference=label_a,
        variant=label_b,
        n_samples_a=samples_a.num_rows,
        n_samples_b=samples_b.num_rows,
        scores=scores,
        tokens=tokens,
        verdict=verdict,
    )


def compare_variants(
    a: VariantDir,
    b: VariantDir,
    *,
    label_a: str | None = None,
    label_b: str | None = None,
    worst_k: int = 5,
    margin: float = DEFAULT_MARGIN,
) -> VariantComparison:
    """Compare variant ``b`` against reference ``a`` from their artifacts.

    Labels default to the directory names; pass e.g. "runA/legacy" when comparing
    across runs where both directories have the same name.
    """
    samples_a, tokens_a = load_variant(a)
    samples_b, tokens_b = load_variant(b)
    return compare_tables(
        samples_a,
        tokens_a,
        samples_b,
        tokens_b,
        label_a=label_a or a.name,
        label_b=label_b or b.name,
        worst_k=worst_k,
        margin=margin,
    )


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


def compare_run(
    run_dir: Path,
    reference: str | None = None,
    variants: list[str] | None = None,
    *,
    worst_k: int = 5,
    margin: float = DEFAULT_MARGIN,
) -> RunComparison:
    """Compare every non-reference variant of ``run_dir`` with the reference.

    Defaults: reference = run.json "reference" (else the first variant); variants =
    run.json "variants" (else every sub-directory with a manifest.json).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} does not exist.")
    rd = RunDir(run_dir)
    info = read_run_info(run_dir)
    names = list(variants) if variants else (variant_names_from_info(info) or rd.variant_names())
    if not names:
        raise ValueError(f"{run_dir} has no variants (no run.json \"variants\" and no <variant>/manifest.json).")
    ref = reference or info.get("reference") or names[0]
    ref = str(ref)
    others = [n for n in dict.fromkeys(names) if n != ref]
    if not others:
        raise ValueError(f"{run_dir} has only the reference variant {ref!r}; there is nothing to compare it with.")
    ref_dir = rd.variant(ref)
    samples_a, tokens_a = load_variant(ref_dir)
    comparisons = []
    for name in others:
        samples_b, tokens_b = load_variant(rd.variant(name))
        comparisons.append(
            compare_tables(
                samples_a, tokens_a, samples_b, tokens_b, label_a=ref, label_b=name, worst_k=worst_k, margin=margin
            )
        )
    run_id = str(info.get("run_id") or run_dir.name)
    return RunComparison(run_id=run_id, reference=ref, comparisons=tuple(comparisons))


def write_outputs(
    run_dir: Path, run_comparison: RunComparison, run_info: dict[str, Any] | None = None
) -> tuple[Path, Path]:
    """Write compare.json and report.md atomically; returns their paths."""
    from evalpipe.report.markdown import render_markdown  # report depends on compare, not vice versa

    rd = RunDir(Path(run_dir))
    if run_info is None:
        run_info = read_run_info(rd.root)
    artifacts.write_json(rd.compare_json, run_comparison.to_dict())
    artifacts.write_text(rd.report_md, render_markdown(run_comparison, run_info))
    return rd.compare_json, rd.report_md


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


def compare_across_runs(a: Path, b: Path, *, margin: float = DEFAULT_MARGIN) -> RunComparison:
    """`evalpipe compare RUN_A/VARIANT RUN_B/VARIANT`: B against A as reference."""
    va, vb = VariantDir(Path(a)), VariantDir(Path(b))
    label_a, label_b = f"{va.root.parent.name}/{va.name}", f"{vb.root.parent.name}/{vb.name}"
    if label_a == label_b:
        label_a, label_b = str(va.root), str(vb.root)
    samples_a, tokens_a = load_variant(va)
    samples_b, tokens_b = load_variant(vb)
    check_same_items(samples_a, samples_b, label_a, label_b)
    vc = compare_tables(samples_a, tokens_a, samples_b, tokens_b, label_a=label_a, label_b=label_b, margin=margin)
    return RunComparison(run_id=f"{label_a} vs {label_b}", reference=label_a, comparisons=(vc,))
