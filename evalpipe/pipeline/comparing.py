"""Read a run directory's artifacts into the pure comparison (compare/) and write the comparison and its reports (report/) back.

:mod:`evalpipe.compare` compares in-memory tables and knows no files;
:mod:`evalpipe.report` renders the compare.json document and run.json and writes nothing.
This module is the one place that joins them to a run directory: it reads
samples.parquet, tokens.parquet, teacher.parquet, manifest.json and run.json
(layout: :mod:`evalpipe.rundir.artifacts`), runs the comparison, and writes compare.json,
report.md, report.html and junit.xml.

Defaults from run.json: the reference ("reference", else the first variant), the
variants ("variants", else every sub-directory with a manifest.json) and the gates
("config"."gates", else the defaults).

Noise floor: when run.json names an A/A run (``"noise_floor": {"variant":
"<reference>-aa"}``), the reference is compared with it first. That comparison is
information, not a verdict: it is left out of the run status and of the variant
list, and its token measures set the relative bounds of every other comparison's
gates (see :mod:`evalpipe.compare.gates`).

Teacher forcing: ``<variant>/teacher.parquet`` holds the reference's continuations
scored by that variant; it is optional, and compared when both sides have one
(:func:`evalpipe.compare.run.compare_tables`).

Verified reading: every variant's files are checked against its manifest before they are
read (:func:`evalpipe.rundir.integrity.verify_variant`), and a variant without a manifest is
refused, unless ``unverified`` (`evalpipe compare --unverified`): it is then read as it is,
and every comparison that used it is INCONCLUSIVE and names it (compare.json "unverified").
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pyarrow as pa
from rich.markup import escape

from evalpipe.compare.numerics import Numerics, numerics_from_engine_args
from evalpipe.compare.run import (
    RunComparison,
    VariantArtifacts,
    VariantComparison,
    check_same_items,
    compare_artifacts,
    with_margin,
)
from evalpipe.config.expectations import Expectations
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.comparison import write_comparison
from evalpipe.documents.localization import LocalizeDocument, read_localizations
from evalpipe.documents.manifest import read_manifest
from evalpipe.documents.run_doc import RunDocument, read_run_document, write_run_document
from evalpipe.errors import UserError
from evalpipe.probing.records import read_probes
from evalpipe.report import render_html, render_junit, render_markdown
from evalpipe.report.terminal import print_summary
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import SAMPLE_KEY, TOKENS_REQUIRED, RunDir, VariantDir
from evalpipe.rundir.integrity import verify_variant

_SAMPLES_REQUIRED = SAMPLE_KEY
_TOKENS_REQUIRED = TOKENS_REQUIRED


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def _where(vdir: VariantDir) -> str:
    return str(vdir.root.parent)


def _read(vdir: VariantDir, path: Path, required: Sequence[str]) -> pa.Table:
    if not vdir.root.is_dir():
        raise UserError(f"variant {vdir.name!r} has no directory in {_where(vdir)}; was it part of this run?")
    if not path.is_file():
        raise UserError(f"variant {vdir.name!r} in {_where(vdir)} has no {path.name}; did its run finish?")
    try:
        table = artifacts.read_table(path)
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise UserError(f"{path} cannot be read as Parquet ({exc}); re-run variant {vdir.name!r}.") from exc
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise UserError(f"{path} lacks the columns {missing}; it was written by an incompatible evalpipe version.")
    return table


def load_variant(vdir: VariantDir) -> tuple[pa.Table, pa.Table]:
    """(samples, tokens) of a variant directory, with a one-sentence ValueError if absent."""
    samples = _read(vdir, vdir.samples, _SAMPLES_REQUIRED)
    tokens = _read(vdir, vdir.tokens, _TOKENS_REQUIRED)
    return samples, tokens


def load_teacher(vdir: VariantDir, path: Path | None = None) -> pa.Table | None:
    """teacher.parquet of a variant (or another teacher-forcing file of it, e.g.
    teacher_baseline.parquet), or None when it has none (teacher forcing is optional)."""
    path = vdir.teacher if path is None else path
    return _read(vdir, path, _TOKENS_REQUIRED) if path.is_file() else None


UNVERIFIED_FIX = "restore it or re-run the variant, or compare it unverified with `evalpipe compare --unverified` (verdict INCONCLUSIVE)"


def load_artifacts(vdir: VariantDir, name: str | None = None, expect: Expectations | None = None, *,
                   unverified: bool = False) -> VariantArtifacts:
    """The artifacts of one variant directory (named ``name``, default the directory name),
    checked against its manifest first (a file changed since the variant finished, or a
    missing manifest, is refused; with ``unverified`` a missing manifest is read, and said),
    with its path probes' records (probes.json) and the expectations they are judged by."""
    if not vdir.root.is_dir():
        raise UserError(f"variant {vdir.name!r} has no directory in {_where(vdir)}; was it part of this run?")
    verified = verify_variant(vdir, allow_unverified=unverified, fix=UNVERIFIED_FIX)
    samples, tokens = load_variant(vdir)
    counters = read_manifest(vdir.manifest).engine_counters if vdir.manifest.is_file() else None
    return VariantArtifacts(name or vdir.name, samples, tokens, load_teacher(vdir), probes=read_probes(vdir.root),
                            expect=expect, verified=verified, counters=counters)


def variant_numerics(vdir: VariantDir) -> Numerics:
    """The precision a variant ran in, from the engine arguments its manifest records."""
    where = f"{vdir.name}/manifest.json"
    args = read_manifest(vdir.manifest).engine_args if vdir.manifest.is_file() else None
    return numerics_from_engine_args(args or None, where)


def read_run_info(run_dir: Path) -> RunDocument:
    """run.json of ``run_dir``, or an empty document when the run directory has none."""
    return read_run_document(run_dir) or RunDocument()


# ---------------------------------------------------------------------------
# comparing
# ---------------------------------------------------------------------------


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
    unverified: bool = False,
) -> VariantComparison:
    """Compare variant ``b`` against reference ``a`` from their artifacts (teacher.parquet included).

    Labels default to the directory names; pass e.g. "runA/legacy" when comparing
    across runs where both directories have the same name.
    """
    return compare_artifacts(
        load_artifacts(a, label_a, unverified=unverified), load_artifacts(b, label_b, unverified=unverified),
        worst_k=worst_k, gates=with_margin(gates, margin), aa=aa,
    )


def compare_run(
    run_dir: Path,
    reference: str | None = None,
    variants: list[str] | None = None,
    *,
    worst_k: int = 5,
    margin: float | None = None,
    gates: Gates | None = None,
    unverified: bool = False,
) -> RunComparison:
    """Compare every non-reference variant of ``run_dir`` with the reference.

    Defaults: reference = run.json "reference" (else the first variant); variants =
    run.json "variants" (else every sub-directory with a manifest.json); gates =
    run.json "config"."gates" (else the defaults). With a noise floor in run.json the
    A/A comparison runs first and bounds the others (module docstring). ``unverified``:
    variants without a manifest are read (module docstring).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist.")
    rd = RunDir(run_dir)
    info = read_run_info(run_dir)
    gates = with_margin(gates if gates is not None else info.gates_of(str(rd.run_json)), margin)
    names = list(variants) if variants else (info.variants or rd.variant_names())
    if not names:
        raise UserError(f"{run_dir} has no variants (no run.json \"variants\" and no <variant>/manifest.json).")
    ref = str(reference or info.reference or names[0])
    aa_name = info.noise_floor_of(ref)
    others = [n for n in dict.fromkeys(names) if n not in (ref, aa_name)]
    if not others:
        raise UserError(f"{run_dir} has only the reference variant {ref!r}; there is nothing to compare it with.")
    where = str(rd.run_json)

    def side(name: str) -> VariantArtifacts:
        return load_artifacts(rd.variant(name), expect=info.expectations_of(name, where), unverified=unverified)

    ref_side = side(ref)
    numerics = variant_numerics(rd.variant(ref))
    aa = None
    if aa_name is not None:
        aa = compare_artifacts(ref_side, side(aa_name), worst_k=worst_k, gates=gates, numerics=numerics)
    comparisons = tuple(
        compare_artifacts(ref_side, side(name), worst_k=worst_k, gates=gates, aa=aa, numerics=numerics)
        for name in others
    )
    run_id = info.run_id or run_dir.name
    return RunComparison.of(run_id=run_id, reference=ref, comparisons=comparisons, noise_floor=aa, gates=gates)


def same_declared_path(expect_a: Expectations | None, expect_b: Expectations | None) -> Expectations | None:
    """``expect_b``, marked as the same path when both runs declare the same one (another
    night, another build): meant to run the same code, so IDENTICAL outputs answer the
    question instead of proving "nothing compared"; each side is still held to its own."""
    if expect_a is not None and expect_b is not None and expect_a.claims() == expect_b.claims():
        return expect_b.model_copy(update={"same_path": True})
    return expect_b


def compare_across_runs(
    a: Path, b: Path, *, worst_k: int = 5, margin: float | None = None, gates: Gates | None = None,
    unverified: bool = False,
) -> RunComparison:
    """`evalpipe compare RUN_A/VARIANT RUN_B/VARIANT`: B against A as reference.

    Gates default to those of run A's run.json. There is no noise floor: an A/A run
    belongs to one run, and two runs need not share their engine settings.
    """
    va, vb = VariantDir(Path(a)), VariantDir(Path(b))
    label_a, label_b = f"{va.root.parent.name}/{va.name}", f"{vb.root.parent.name}/{vb.name}"
    if label_a == label_b:
        label_a, label_b = str(va.root), str(vb.root)
    info_a, info_b = read_run_info(va.root.parent), read_run_info(vb.root.parent)
    if gates is None:
        gates = info_a.gates_of(str(RunDir(va.root.parent).run_json))
    gates = with_margin(gates, margin)
    expect_a = info_a.expectations_of(va.name, str(RunDir(va.root.parent).run_json))
    expect_b = info_b.expectations_of(vb.name, str(RunDir(vb.root.parent).run_json))
    expect_b = same_declared_path(expect_a, expect_b)
    side_a = load_artifacts(va, label_a, expect_a, unverified=unverified)
    side_b = load_artifacts(vb, label_b, expect_b, unverified=unverified)
    check_same_items(side_a.samples, side_b.samples, label_a, label_b)
    vc = compare_artifacts(side_a, side_b, worst_k=worst_k, gates=gates, numerics=variant_numerics(va))
    return RunComparison.of(run_id=f"{label_a} vs {label_b}", reference=label_a, comparisons=(vc,), gates=gates)


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def write_outputs(
    run_dir: Path, run_comparison: RunComparison, run_info: RunDocument | None = None, *, plots: bool = True,
    localizations: Sequence[LocalizeDocument] = (),
) -> dict[str, Path]:
    """Write compare.json, report.md, report.html and junit.xml atomically.

    compare.json is written first: the reports are renderings of it, so a failure
    while drawing a plot never loses the comparison itself. The reports carry
    ``localizations`` (`evalpipe localize`'s, :func:`readable_localizations`) as their
    "Where it starts" section."""
    rd = RunDir(Path(run_dir))
    header = run_info if run_info is not None else read_run_info(rd.root)
    data = run_comparison.doc
    write_comparison(rd.compare_json, data)
    artifacts.write_text(rd.junit_xml, render_junit(data))
    artifacts.write_text(rd.report_md, render_markdown(data, header, localizations))
    artifacts.write_text(rd.report_html, render_html(data, header, plots=plots, localizations=localizations))
    return {"compare": rd.compare_json, "junit": rd.junit_xml, "markdown": rd.report_md, "html": rd.report_html}


def report_run(
    run_dir: Path,
    reporter: Reporter,
    info: RunDocument | None = None,
    *,
    reference: str | None = None,
    variants: list[str] | None = None,
    output: Path | None = None,
    gates: Gates | None = None,
    unverified: bool = False,
) -> tuple[int, RunDocument]:
    """Compare a run's stored artifacts, write compare.json and the reports (into ``output``,
    default the run directory, whose run.json then records the verdict) and print the
    summary: the end of a run, and `evalpipe compare RUN_DIR` (``unverified``: its
    --unverified). Returns the verdict's exit code and run.json's content as it now stands,
    with this comparison's verdict (with ``output``, run.json itself is left as it was)."""
    rd = artifacts.RunDir(run_dir)
    if info is None:  # a broken run.json: one sentence naming it
        info = read_run_document(rd.root) or RunDocument()
    comparison = compare_run(rd.root, reference=reference, variants=variants, gates=gates, unverified=unverified)
    verdict = comparison.status
    if output is None:
        info = info.updated(status="ok", verdict=verdict)
        write_run_document(rd.run_json, info)
    # localize.json stays in the run directory when the reports go elsewhere (--output)
    localizations = readable_localizations(rd.root, reporter)
    written = write_outputs(Path(output) if output is not None else rd.root, comparison, info, localizations=localizations)
    print_summary(comparison.doc, reporter.console, localizations=localizations)
    print_written(written, reporter)
    return verdict.exit_code, info.updated(verdict=verdict) if output is not None else info


def readable_localizations(run_dir: Path, reporter: Reporter) -> list[LocalizeDocument]:
    """localize.json's localizations for the reports; one that cannot be read costs a warning
    and the section, never the comparison."""
    try:
        return read_localizations(run_dir)
    except UserError as err:
        reporter.warning(f"[yellow]warning:[/] the reports leave out where the divergence starts: {escape(str(err))}")
        return []


def print_written(written: dict[str, Path], reporter: Reporter) -> None:
    reporter.info(f"report: {written['html']}  ({written['markdown'].name}, {written['compare'].name}, {written['junit'].name} beside it)")


def compare_with_reference_run(reference_run: Path, candidate: Path, *, label: str, worst_k: int = 5,
                               against: Path | None = None) -> RunComparison:
    """``candidate`` (a variant directory of another run: a bisect's step) against the
    reference of ``reference_run``, bounded by that run's A/A comparison, judged by its
    gates: the good build measured once, with its own noise, for every step. ``against``:
    another variant directory in the reference's place (a build's second run against its
    first), still bounded by the reference run's floor."""
    rd = RunDir(reference_run)
    info = read_run_info(reference_run)
    where = str(rd.run_json)
    gates = info.gates_of(where)
    ref = str(info.reference)
    aa_name = info.noise_floor_of(ref)
    expect_ref = info.expectations_of(ref, where)
    ref_side = load_artifacts(rd.variant(ref), expect=expect_ref)
    numerics = variant_numerics(rd.variant(ref))
    aa = None
    if aa_name is not None:
        aa = compare_artifacts(ref_side, load_artifacts(rd.variant(aa_name), expect=info.expectations_of(aa_name, where)),
                               worst_k=worst_k, gates=gates, numerics=numerics)
    if against is not None:
        other = VariantDir(against)
        expect_ref = read_run_info(against.parent).expectations_of(other.name, str(RunDir(against.parent).run_json))
        ref = f"{against.parent.name}/{other.name}"
        ref_side = load_artifacts(other, ref, expect_ref)
    vdir = VariantDir(candidate)
    cand_info = read_run_info(candidate.parent)
    expect = cand_info.expectations_of(vdir.name, str(RunDir(candidate.parent).run_json))
    expect = same_declared_path(expect_ref, expect)
    side = load_artifacts(vdir, label, expect)
    check_same_items(ref_side.samples, side.samples, ref, label)
    vc = compare_artifacts(ref_side, side, worst_k=worst_k, gates=gates, aa=aa, numerics=numerics)
    return RunComparison.of(run_id=f"{reference_run.name}/{ref} vs {label}", reference=ref, comparisons=(vc,),
                            noise_floor=aa, gates=gates)
