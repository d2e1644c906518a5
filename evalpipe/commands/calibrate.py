"""`evalpipe calibrate`: run the layout model's fault zoo against the legacy layout and
write the calibration table (what a PASS is worth).

One evalpipe run holds every entry as a variant: the config's own variants (the
reference `legacy` and the pass-through `sp`, expected to be benign), two benign
controls of the engine itself (the reference again with another batch arrangement, the
"A/A2", and with two compute threads) plus one variant per zoo fault (`sp` with
``EVALPIPE_LAYOUT_FAULT`` set). The run is compared as usual (compare.json, reports);
then every variant gets a calibration row (:mod:`evalpipe.compare.calibration`), the
graded faults a sensitivity point at 100 items and at all items, every gate its firing
rate over the A/A pairs and the benign entries, and the table goes to
docs/calibration.md with the sensitivity plot beside it.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.table import Table

from evalpipe.compare.calibration import (
    calibration_row,
    compare_first,
    detection_cost,
    failed_row,
    gate_firing,
    item_order,
    place_name,
    sampled_failure,
    sampled_verdict,
    sensitivity_point,
    summarize,
    summarize_sampled,
)
from evalpipe.compare.run import VariantComparison, compare_artifacts
from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import load_config
from evalpipe.config.run_config import RunConfig, Variant
from evalpipe.config.sampling import Sampling
from evalpipe.documents.calibration import CalibrationFile, CalibrationRow, Expected, SampledVerdict, SensitivityPoint, write_calibration
from evalpipe.documents.comparison import Status
from evalpipe.documents.localization import read_localizations
from evalpipe.documents.run_doc import RunDocument, RunStatus, read_run_document
from evalpipe.errors import RunFailed
from evalpipe.execution.preimport import Preimport
from evalpipe.install import checkout_root, default_config
from evalpipe.lab.layout.faults import FAULT_ENV, FAULTS, LAST_LAYER, Fault
from evalpipe.lab.layout.settings import LAYOUT_ENV
from evalpipe.pipeline.comparing import compare_run, load_artifacts, readable_localizations, write_outputs
from evalpipe.pipeline.localizing import Request, localize_run
from evalpipe.pipeline.plan import make_plan
from evalpipe.pipeline.runner import execute
from evalpipe.report.calibration import render_calibration, sensitivity_plot
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts
from evalpipe.validation import first_problem


def default_table() -> Path:
    """The project's docs/calibration.md when evalpipe runs from its source checkout (the
    table is part of the project's documentation); a built install has no docs of its own
    to update, so there it is calibration.md in the current directory."""
    root = checkout_root()
    return root / "docs" / "calibration.md" if root is not None else Path("calibration.md")


def _shown(path: Path) -> str:
    """A path as the regenerate command gives it: relative to the checkout when inside it."""
    root = checkout_root()
    try:
        return str(path.resolve().relative_to(root)) if root is not None else str(path)
    except ValueError:
        return str(path)


def zoo(names: list[str] | None = None) -> list[Fault]:
    """The faults to calibrate: all of them (except those the model itself refuses to
    run, which the tests cover), or the named ones."""
    if names:
        unknown = [n for n in names if n not in FAULTS]
        if unknown:
            raise ConfigError(f"unknown fault `{unknown[0]}`; known: {', '.join(FAULTS)}.")
        return [FAULTS[n] for n in names]
    return [f for f in FAULTS.values() if not (f.raises or f.hangs)]


def fault_kind(fault: Fault) -> Expected:
    if fault.falls_back:
        return "fallback"
    return "graded" if fault.magnitude is not None else "harmful" if fault.harmful else "benign"


def fault_variant(fault: Fault, config: RunConfig) -> Variant:
    """``sp`` (or the layout the fault acts on) with the fault switched on. It declares the
    expectations of the config's variant of that layout: a fault is a bug on that path,
    and `sp_fallback`, which leaves the path, must come out INCONCLUSIVE by them."""
    engine: dict[str, Any] = {}
    if fault.needs_scale:
        # the scale the fault is documented with (the one at which it really bites)
        engine = {"hf_overrides": {"layout_out_scale": fault.out_scale}}
    layout = "sp" if fault.layout == "any" else fault.layout
    same_layout = next((v for v in config.variants.values() if v.env.get(LAYOUT_ENV) == layout), None)
    return Variant(
        description=f"{fault.layout} + fault {fault.name} ({fault_kind(fault)})",
        env={LAYOUT_ENV: layout, FAULT_ENV: fault.name},
        engine=engine,
        expect=dict(same_layout.expect) if same_layout is not None else {},
    )


AA2_SUFFIX = "-aa2"
SAMPLED_SUFFIX = "-sampled"  # the zoo's sampled run (--temperature), beside the greedy one
THREADS_SUFFIX = "-threads2"
SENSITIVITY_ITEMS = 100  # the smoke-test size the sensitivity curve is also read at


def control_variants(config: RunConfig) -> dict[str, tuple[Variant, str]]:
    """Benign controls of the engine itself, made from the reference: the A/A2 (another
    batch arrangement than the A/A run's: max_num_seqs quartered, requests in order) and
    two compute threads (another split of every matmul's reduction)."""
    ref_name = config.reference_name
    ref = config.variants[ref_name]
    seqs = int(ref.engine.get("max_num_seqs", config.engine.get("max_num_seqs", 256)))
    # the reference's path again: meant to run the same code (A/A pairs)
    same_path = {**ref.expect, "same_path": True}
    aa2 = Variant(
        description=f"A/A2: {ref_name} again with max_num_seqs {max(1, seqs // 4)} (the A/A run halves it and reverses the order)",
        env=dict(ref.env),
        engine={**ref.engine, "max_num_seqs": max(1, seqs // 4)},
        python=ref.python,
        launch=dict(ref.launch),
        expect=same_path,
    )
    threads = Variant(
        description=f"{ref_name} on two compute threads (OMP_NUM_THREADS=2): every matmul's reduction split differently",
        env={**ref.env, "OMP_NUM_THREADS": "2"},
        engine=dict(ref.engine),
        python=ref.python,
        launch=dict(ref.launch),
        expect=same_path,
    )
    return {
        ref_name + AA2_SUFFIX: (aa2, "The reference's run-to-run noise under a third batch arrangement: a second A/A pair."),
        ref_name + THREADS_SUFFIX: (threads, "Two compute threads instead of one: same arithmetic, another reduction split."),
    }


def calibration_config(config: RunConfig, faults: list[Fault]) -> tuple[RunConfig, dict[str, tuple[Expected, str]]]:
    """The config with the engine controls and one variant per fault; and per variant (expected, doc)."""
    variants = dict(config.variants)
    expected: dict[str, tuple[Expected, str]] = {
        name: ("benign", v.description or "layout variant without a fault")
        for name, v in config.variants.items()
        if name != config.reference_name
    }
    for name, (variant, doc) in control_variants(config).items():
        if name in variants:
            raise ConfigError(f"the config already has a variant `{name}`; rename it (calibration adds it).")
        variants[name] = variant
        expected[name] = ("benign", doc)
    for fault in faults:
        name = f"fault-{fault.name}"
        if name in variants:
            raise ConfigError(f"the config already has a variant `{name}`; rename it (calibration adds it).")
        variants[name] = fault_variant(fault, config)
        expected[name] = (fault_kind(fault), fault.doc)
    data = config.model_dump(mode="json")
    data["variants"] = {k: v.model_dump(mode="json") for k, v in variants.items()}
    return RunConfig.model_validate(data), expected


def _sampled_settings(temperature: float | None, samples: int | None) -> Sampling | None:
    """The sampled run's settings from --temperature and --samples, checked by the config's own
    `sampling:` model (one range, one sentence); None: no sampled run."""
    if temperature is None:
        if samples is not None:
            raise ConfigError(f"--samples {samples} applies to the sampled run, which --temperature asks for; give "
                              "--temperature too (e.g. 0.6), or leave --samples out.")
        return None
    try:
        return Sampling(temperature=temperature, samples=1 if samples is None else samples)
    except ValidationError as err:
        field, why = first_problem(err)
        flag = "--samples" if field.endswith("samples") else "--temperature"
        raise ConfigError(f"{flag} {samples if flag == '--samples' else f'{temperature:g}'}: {why}") from None


def run_calibration(
    config_path: Path | None,
    limit: int | None,
    fault_names: list[str] | None,
    table_path: Path | None,
    reporter: Reporter,
    run_id: str | None = None,
    output: Path | None = None,
    from_run: Path | None = None,
    localize: bool = True,
    temperature: float | None = None,
    samples: int | None = None,
    task_group: str | None = None,
) -> int:
    """Run the zoo and write the table; with ``from_run``, judge that finished calibration
    run again (same config and faults) without starting an engine: new gates, or a table
    whose writing failed after hours of engine time. With ``temperature``, the zoo runs a
    second time with sampled decoding (``samples`` per item, common random numbers) and the
    table gets that run's verdicts beside the greedy ones."""

    path = Path(config_path) if config_path else default_config()
    table_path = table_path or default_table()
    sampling = _sampled_settings(temperature, samples)
    base = load_config(path)
    if base.sampling is not None or any(s.sampling is not None for specs in base.tasks.values() for s in specs):
        raise ConfigError(f"{path} samples already; calibrate a greedy config and ask for the sampled run with --temperature.")
    faults = zoo(fault_names)
    config, expected = calibration_config(base, faults)
    graded = {f"fault-{f.name}": f.magnitude for f in faults if f.magnitude is not None}
    places = {f"fault-{f.name}": f.place for f in faults}
    if task_group is not None and task_group not in config.tasks:
        raise ConfigError(f"--tasks {task_group}: {path} has no such task group; its groups are {', '.join(config.tasks)}.")
    task_group = task_group or next(iter(config.tasks))
    started = time.time()
    # one set of pre-imported interpreters for the zoo run, its localization and its sampled
    # run, whose processes all carry the zoo run's mark (a server forks only for its own mark)
    with Preimport() as starter:
        run_dir, info, seconds = _zoo_run(config, path, task_group, limit, output, run_id, from_run, reporter, starter)
        judged = _judge_zoo(run_dir, info, expected, graded, reporter)
        rows, comparisons, sensitivity = judged.rows, judged.comparisons, judged.sensitivity
        if localize and comparisons:
            rows = _localized(rows, run_dir, places, reporter, again=from_run is None, starter=starter)
        if sampling is not None:
            # the sampled run sits beside the greedy one as `<run id>-sampled`; judging a finished
            # calibration again (--from-run) judges its sampled run too, and runs it when it is missing
            sampled_root = run_dir.parent if from_run is not None else output
            sampled_id = f"{run_dir.name}{SAMPLED_SUFFIX}"
            verdicts = _sampled_run(config.model_copy(update={"sampling": sampling}), path, task_group, limit, sampled_root,
                                    sampled_id, expected, reporter, starter, mark=run_dir.name)
            rows = [r.model_copy(update={"sampled": verdicts.get(r.variant)}) for r in rows]

    options = (("-c", config_path), ("--tasks", task_group if task_group != next(iter(config.tasks)) else None),
               ("--limit", limit), ("--faults", ",".join(fault_names) if fault_names else None),
               ("--temperature", temperature), ("--samples", samples),
               ("--table", _shown(table_path) if table_path != default_table() else None))
    command = "evalpipe calibrate" + "".join(f" {flag} {shlex.quote(str(v))}" for flag, v in options if v is not None) + \
        ("" if localize else " --no-localize")
    benign = [c for c in comparisons if expected.get(c.variant, ("benign", ""))[0] == "benign"]
    firing = {"aa_pairs": gate_firing(judged.aa_pairs), "benign": gate_firing(benign)}
    plot_path = table_path.with_name(table_path.stem + "-sensitivity.png")
    if sensitivity:
        artifacts.write_bytes(plot_path, sensitivity_plot(sensitivity))
    if from_run is not None and judged.comparison is not None:
        # compare.json and the reports under today's gates
        write_outputs(run_dir, judged.comparison, info, localizations=readable_localizations(run_dir, reporter))
    text = render_calibration(
        rows, info, command=command, seconds=time.time() - started if seconds is None else seconds, run_dir=run_dir,
        sensitivity=sensitivity, firing=firing, plot=plot_path.name if sensitivity else None,
        numerics=comparisons[0].numerics if comparisons else None,
    )
    artifacts.write_text(table_path, text)
    summary, sampled_summary = summarize(rows), summarize_sampled(rows)
    write_calibration(run_dir, CalibrationFile(
        rows=rows, summary=summary, sampled_summary=sampled_summary, sensitivity=sensitivity,
        gate_firing={k: dict(f) for k, f in firing.items()},
    ))
    _print_rows(rows, reporter)
    reporter.info(f"table: {table_path}")
    return 0 if summary.all_as_expected and (sampled_summary is None or sampled_summary.all_as_expected) else 1


def _zoo_run(config: RunConfig, path: Path, task_group: str, limit: int | None, output: Path | None, run_id: str | None,
             from_run: Path | None, reporter: Reporter, starter: Preimport) -> tuple[Path, RunDocument, float | None]:
    """(run directory, its run.json, its seconds when judged again): the zoo run now, or the
    finished one ``from_run`` names (refused unless it has every variant of the zoo)."""
    if from_run is not None:
        run_dir = Path(from_run)
        found = read_run_document(run_dir)
        missing = [v for v in config.variants if v not in (found.variants if found else [])]
        if found is None or missing:
            what = "has no run.json" if found is None else f"lacks the variants {', '.join(missing[:3])}"
            raise ConfigError(
                f"{run_dir} {what}; --from-run needs a finished `evalpipe calibrate` run with the same -c and --faults."
            )
        return run_dir, found, float(found.timings.total_s or 0.0)
    plan = make_plan(config, str(path), task_group, limit=limit, output=str(output) if output else None, run_id=run_id)
    try:
        # exit code ignored: DIVERGENT is the expected outcome for harmful entries
        info = execute(plan, reporter, starter=starter).document
    except RunFailed as err:
        # A fault that brings the engine down fails its variant only; the others were compared
        # (the run raised instead of returning: what it saved is read back).
        info = read_run_document(plan.run_dir) or RunDocument()
        if not info.failed_variants:
            raise
        reporter.warning(f"[yellow]{err}[/]")
    return plan.run_dir, info, None


@dataclasses.dataclass
class _JudgedZoo:
    """The zoo's comparisons and what calibrate measures on them."""

    rows: list[CalibrationRow]
    comparisons: tuple[VariantComparison, ...] = ()
    comparison: Any = None  # the run's comparison (None: nothing but the reference and its A/A finished)
    sensitivity: list[SensitivityPoint] = dataclasses.field(default_factory=list)
    aa_pairs: list[VariantComparison] = dataclasses.field(default_factory=list)


def _judge_zoo(run_dir: Path, info: RunDocument, expected: dict[str, tuple[Expected, str]], graded: dict[str, float],
               reporter: Reporter) -> _JudgedZoo:
    """Each entry compared with the reference: its row (with the detection cost of a DIVERGENT
    one), a graded entry's sensitivity by item count, the two A/A pairs; a failed entry's row."""
    failed = [v for v in info.variants if v in set(info.failed_variants)]
    survivors = [v for v in info.variants if v not in failed]
    judged = _JudgedZoo(rows=[])
    if set(survivors) - {info.reference, info.aa_variant}:
        rd = artifacts.RunDir(run_dir)
        comparison = compare_run(run_dir, variants=survivors)
        judged.comparison, judged.comparisons = comparison, comparison.comparisons
        gates = comparison.doc.gates

        def side_of(name: str):  # with the expectations it ran under: the A/A pairs below are judged on their paths too
            return load_artifacts(rd.variant(name), expect=info.expectations_of(name))

        ref = side_of(comparison.doc.reference)
        aa = side_of(comparison.noise_floor.variant) if comparison.noise_floor else None
        numerics = judged.comparisons[0].numerics if judged.comparisons else None
        for c in judged.comparisons:
            kind, doc = expected.get(c.variant, ("benign", ""))
            side = side_of(c.variant)
            cost = None
            if c.status is Status.DIVERGENT:
                reporter.info(f"detection cost of {c.variant} ...")
                cost = detection_cost(ref, side, gates, aa=aa, numerics=numerics)
            judged.rows.append(calibration_row(c, kind, cost=cost, doc=doc, metric="exact_match,strict-match"))
            magnitude = graded.get(c.variant)
            if magnitude is not None:
                n_all = len(item_order(side.samples))
                for n in sorted({min(SENSITIVITY_ITEMS, n_all), n_all}):
                    at_n = c if n == n_all else compare_first(ref, side, gates, n, aa=aa, numerics=numerics)
                    judged.sensitivity.append(sensitivity_point(at_n, magnitude, n, gates))
            if c.variant.endswith(AA2_SUFFIX) and aa is not None:
                # the two A/A pairs: reference vs A/A2 (A/A as its floor) is the row above;
                # reference vs A/A with A/A2 as its floor is the other
                judged.aa_pairs.append(c)
                floor2 = compare_artifacts(ref, side, worst_k=0, gates=gates, numerics=numerics)
                judged.aa_pairs.append(compare_artifacts(ref, aa, worst_k=0, gates=gates, aa=floor2, numerics=numerics))
    for name in failed:
        kind, doc = expected.get(name, ("benign", ""))
        judged.rows.append(failed_row(name, kind, str(info.variant_status[name].error), doc=doc))
    return judged


def _sampled_run(config: RunConfig, path: Path, task_group: str, limit: int | None, output: Path | None,
                 run_id: str | None, expected: dict[str, tuple[Expected, str]], reporter: Reporter, starter: Preimport, *,
                 mark: str) -> dict[str, SampledVerdict]:
    """The zoo once more with the config's `sampling:`: every entry's verdict under common random
    numbers; its processes carry ``mark`` (the zoo run's), so they fork from ``starter``'s servers."""
    sampling = config.sampling
    assert sampling is not None  # the caller set it
    earlier = Path(output) / run_id if output is not None and run_id is not None else None
    found = read_run_document(earlier) if earlier is not None else None
    # a run that ended (ok, or failed with some variants: a fault that stops the engine fails alone)
    if earlier is not None and found is not None and (found.status is RunStatus.OK or (found.status is RunStatus.FAILED and found.failed_variants)):
        reporter.step(f"the zoo's sampled run {earlier}: judged again")
        info, run_dir = found, earlier
    else:
        plan = make_plan(config, str(path), task_group, limit=limit, output=str(output) if output else None, run_id=run_id,
                         process_mark=mark)
        run_dir = plan.run_dir
        reporter.step(f"the zoo again at temperature {sampling.temperature:g}, {sampling.samples} sample(s) per item")
        try:
            info = execute(plan, reporter, starter=starter).document
        except RunFailed as err:
            info = read_run_document(run_dir) or RunDocument()
            if not info.failed_variants:
                raise
            reporter.warning(f"[yellow]{err}[/]")
    failed = set(info.failed_variants)
    survivors = [v for v in info.variants if v not in failed]
    out: dict[str, SampledVerdict] = {}
    if set(survivors) - {info.reference, info.aa_variant}:
        for c in compare_run(run_dir, variants=survivors).comparisons:
            out[c.variant] = sampled_verdict(c, expected.get(c.variant, ("benign", ""))[0], sampling.temperature, sampling.samples)
    for name in failed:
        out[name] = sampled_failure(expected.get(name, ("benign", ""))[0], sampling.temperature, sampling.samples)
    return out


def _localized(rows: list[CalibrationRow], run_dir: Path, places: dict[str, tuple[int, str] | None],
               reporter: Reporter, *, again: bool, starter: Preimport) -> list[CalibrationRow]:
    """Every compared entry through `evalpipe localize` (the reference and its A/A started
    once for all; ``again`` false: the run's localize.json as it is): the first module above
    the floor next to the entry's known place."""
    names = tuple(r.variant for r in rows if r.status != "FAILED")
    found = localize_run(run_dir, reporter, Request(names), starter=starter) if again else read_localizations(run_dir)
    docs = {d.variant: d for d in found}
    out = []
    for r in rows:
        doc = docs.get(r.variant)
        if doc is None:
            out.append(r)
            continue
        last = max((m.layer for m in doc.modules), default=0)
        known = places.get(r.variant)
        expected = place_name(None, None) if known is None else place_name(last if known[0] == LAST_LAYER else known[0], known[1])
        first = place_name(doc.first.layer, doc.first.module) if doc.first is not None else place_name(None, None)
        out.append(r.model_copy(update={"localized": first, "expected_place": expected}))
    return out


def _print_rows(rows: list[CalibrationRow], reporter: Reporter) -> None:
    table = Table("variant", "expected", "verdict", "outcome", "detectors", "detection cost", "localized first")
    for r in rows:
        style = "green" if r.outcome in ("caught", "clean") else "yellow" if r.outcome == "not caught" else "bold red"
        table.add_row(
            r.variant, r.expected, r.status, f"[{style}]{r.outcome}[/]", ", ".join(r.detectors) or "—",
            "—" if r.detection_cost is None else str(r.detection_cost),
            "—" if r.localized is None else f"{r.localized}" + {True: " ✓", False: f" ✗ (known: {r.expected_place})", None: ""}[r.placed],
        )
    reporter.table(table, [r.model_dump(mode="json") for r in rows])

