"""`evalpipe calibrate`: run the layout model's fault zoo against the legacy layout and
write the calibration table (what a PASS is worth).

One evalpipe run holds every entry as a variant: the config's own variants (the
reference `legacy` and the pass-through `sp`, expected to be benign) plus one variant
per zoo fault (`sp` with ``EVALPIPE_LAYOUT_FAULT`` set, or `legacy` for faults of that
layout). The run is compared as usual (compare.json, reports); then every variant gets
a calibration row (:mod:`evalpipe.compare.calibration`) and the table goes to
docs/calibration.md.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evalpipe import artifacts
from evalpipe.config import DEFAULT_CONFIG, ConfigError, RunConfig, Variant
from evalpipe.layout.faults import FAULT_ENV, FAULTS, Fault
from evalpipe.layout.settings import LAYOUT_ENV
from evalpipe.paths import PROJECT_ROOT

DEFAULT_TABLE = PROJECT_ROOT / "docs" / "calibration.md"


def zoo(names: list[str] | None = None) -> list[Fault]:
    """The faults to calibrate: all of them (except those the model itself refuses to
    run, which the tests cover), or the named ones."""
    if names:
        unknown = [n for n in names if n not in FAULTS]
        if unknown:
            raise ConfigError(f"unknown fault `{unknown[0]}`; known: {', '.join(FAULTS)}.")
        return [FAULTS[n] for n in names]
    return [f for f in FAULTS.values() if not f.raises]


def fault_variant(fault: Fault) -> Variant:
    engine: dict[str, Any] = {}
    if fault.needs_scale:
        # the scale the fault is documented with (the one at which it really bites)
        engine = {"hf_overrides": {"layout_out_scale": fault.out_scale}}
    kind = "harmful" if fault.harmful else "benign"
    return Variant(
        description=f"{fault.layout} + fault {fault.name} ({kind})",
        env={LAYOUT_ENV: fault.layout, FAULT_ENV: fault.name},
        engine=engine,
    )


def calibration_config(config: RunConfig, faults: list[Fault]) -> tuple[RunConfig, dict[str, tuple[str, str]]]:
    """The config with one variant per fault; and per variant (expected, doc)."""
    variants = dict(config.variants)
    expected: dict[str, tuple[str, str]] = {
        name: ("benign", v.description or "layout variant without a fault")
        for name, v in config.variants.items()
        if name != config.reference_name
    }
    for fault in faults:
        name = f"fault-{fault.name}"
        if name in variants:
            raise ConfigError(f"the config already has a variant `{name}`; rename it (calibration adds it).")
        variants[name] = fault_variant(fault)
        expected[name] = ("harmful" if fault.harmful else "benign", fault.doc)
    data = config.model_dump(mode="json")
    data["variants"] = {k: v.model_dump(mode="json") for k, v in variants.items()}
    return RunConfig.model_validate(data), expected


def run_calibration(
    config_path: Path | None,
    limit: int | None,
    fault_names: list[str] | None,
    table_path: Path,
    console: Console,
    run_id: str | None = None,
    output: Path | None = None,
) -> int:
    from evalpipe.compare.calibration import calibration_row, detection_cost, failed_row, summarize
    from evalpipe.compare.run import VariantArtifacts, compare_run, read_run_info
    from evalpipe.config import load_config
    from evalpipe.plan import make_plan
    from evalpipe.runner import RunFailed, execute

    path = Path(config_path) if config_path else DEFAULT_CONFIG
    base = load_config(path)
    config, expected = calibration_config(base, zoo(fault_names))
    task_group = next(iter(config.tasks))
    plan = make_plan(config, str(path), task_group, limit=limit, output=str(output) if output else None, run_id=run_id)
    started = time.time()
    try:
        execute(plan, console)  # exit code ignored: DIVERGENT is the expected outcome for harmful entries
    except RunFailed as err:
        # A fault that brings the engine down fails its variant only; the others were compared.
        if not read_run_info(plan.run_dir).get("failed_variants"):
            raise
        console.print(f"[yellow]{err}[/]")

    info = read_run_info(plan.run_dir)
    failed = [v for v in info["variants"] if v in set(info.get("failed_variants") or ())]
    survivors = [v for v in info["variants"] if v not in failed]
    essential = {info["reference"], (info.get("noise_floor") or {}).get("variant")}
    comparisons = ()
    rd = artifacts.RunDir(plan.run_dir)
    if set(survivors) - essential:
        comparison = compare_run(plan.run_dir, variants=survivors)
        comparisons = comparison.comparisons
        ref = VariantArtifacts.load(rd.variant(comparison.reference))
        aa = VariantArtifacts.load(rd.variant(comparison.noise_floor.variant)) if comparison.noise_floor else None
    rows = []
    for c in comparisons:
        kind, doc = expected.get(c.variant, ("benign", ""))
        cost = None
        if c.status.value == "DIVERGENT":
            console.print(f"detection cost of {c.variant} ...")
            cost = detection_cost(ref, VariantArtifacts.load(rd.variant(c.variant)), comparison.gates, aa=aa)
        rows.append(calibration_row(c, kind, cost=cost, doc=doc, metric="exact_match,strict-match"))
    for name in failed:
        kind, doc = expected.get(name, ("benign", ""))
        rows.append(failed_row(name, kind, str(info["variant_status"][name].get("error")), doc=doc))

    from evalpipe.report.calibration import render_calibration

    options = (("-c", config_path), ("--limit", limit), ("--faults", ",".join(fault_names) if fault_names else None))
    command = "evalpipe calibrate" + "".join(f" {flag} {shlex.quote(str(v))}" for flag, v in options if v is not None)
    text = render_calibration(rows, info, command=command, seconds=time.time() - started, run_dir=plan.run_dir)
    artifacts.write_text(table_path, text)
    artifacts.write_json(rd.root / "calibration.json", {"rows": [r.to_dict() for r in rows], "summary": summarize(rows)})
    _print_rows(rows, console)
    console.print(f"table: {table_path}")
    counts = summarize(rows)
    return 0 if counts["missed"] == 0 and counts["false alarm"] == 0 else 1


def _print_rows(rows, console: Console) -> None:
    table = Table("variant", "expected", "verdict", "outcome", "detectors", "detection cost")
    for r in rows:
        style = "green" if r.outcome in ("caught", "clean") else "bold red"
        table.add_row(
            r.variant, r.expected, r.status, f"[{style}]{r.outcome}[/]", ", ".join(r.detectors) or "—",
            "—" if r.detection_cost is None else str(r.detection_cost),
        )
    console.print(table)

