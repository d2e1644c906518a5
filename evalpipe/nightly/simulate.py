"""`evalpipe history simulate`: a nightly history on one machine, in minutes.

Two real runs of the config's nightly tasks are made first (the sources): one as the
config says (with the reference's A/A run), and one of `sp` alone with a layout fault
switched on (``padding_not_zeroed``, via ``EVALPIPE_LAYOUT_FAULT``: what a broken
vllm-ascend build would do). The nights are
then built from their stored artifacts, one day apart, and each is recorded and
judged exactly as `evalpipe nightly` judges a night:

- nights before ``fault_night``: A/A nights. Nothing changes but the engine's own
  noise: each night's `sp` is, by a seeded draw, the real `sp` run or the real A/A
  run of the reference (another batch arrangement), so token measures move from night
  to night as they do on a real machine; recorded as build ``good``;
- nights from ``fault_night`` to ``fix_night``: `sp` from the fault run, recorded as
  build ``fault`` (the component change the bisect hint must name);
- nights from ``fix_night`` on: A/A nights again, build ``fixed``.

Every night keeps the run.json of the config's real run (its settings and config
hash), with its own run id, time and components; its compare.json and reports are
computed from the artifacts it holds. A night whose `sp` is the reference's A/A run
records the A/A run's expectations for it: its path probes show the reference's code,
and judged by sp's expectations that night would be INCONCLUSIVE, not an A/A night.
Expected: the detector flags exactly the fault night, nothing before it, and the
history clears after the fix.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalpipe.config.loading import load_config
from evalpipe.documents.nightly_doc import NightStatus, SeriesChange
from evalpipe.documents.run_doc import RunDocument, RunStatus, SimulatedNight, read_run_document, write_run_document
from evalpipe.errors import UserError
from evalpipe.history.store import open_history
from evalpipe.install import config_label
from evalpipe.nightly.night import NightResult, record_and_judge
from evalpipe.pipeline.comparing import compare_run, write_outputs
from evalpipe.pipeline.plan import make_plan
from evalpipe.pipeline.runner import execute
from evalpipe.reporting import Reporter
from evalpipe.rundir.artifacts import RunDir

FAULT = "padding_not_zeroed"
FAULT_VARIANT = "sp"
BUILDS = ("good", "fault", "fixed")
DAY = 86400.0
NIGHT_MARKS: dict[NightStatus, str] = {NightStatus.PASS: "[green]PASS[/]", NightStatus.INCONCLUSIVE: "[bold yellow]INCONCLUSIVE[/]",
                                       NightStatus.REGRESSION: "[bold red]REGRESSION[/]", NightStatus.FAILED: "[red]FAILED[/]"}


@dataclass
class SimulationSummary:
    nights: list[NightResult]
    fault_night: int | None
    fix_night: int | None
    flagged: list[SeriesChange] = field(default_factory=list)

    @property
    def flagged_nights(self) -> list[str]:
        return sorted({c.first_bad for c in self.flagged})

    @property
    def as_expected(self) -> bool:
        ids = [r.judgement.run_id for r in self.nights]
        expected = [ids[self.fault_night]] if self.fault_night is not None and self.fault_night < len(ids) else []
        return self.flagged_nights == expected


def source_runs(config: Path | None, limit: int, root: Path, reporter: Reporter) -> tuple[Path, Path]:
    """The two real runs (made once; reused when they exist)."""
    cfg = load_config(config)
    out = []
    for name in ("good", "fault"):
        run_dir = root / f"source-{name}"
        source = read_run_document(run_dir)
        if source is not None and source.status is RunStatus.OK:
            out.append(run_dir)
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an interrupted source run: make it again
        this = cfg
        if name == "fault":
            sp = cfg.variants[FAULT_VARIANT]
            this = cfg.model_copy(update={"variants": {**cfg.variants, FAULT_VARIANT: sp.model_copy(update={"env": {**sp.env, "EVALPIPE_LAYOUT_FAULT": FAULT}})}})
        # the fault run needs only the variant the fault is in: the nights take the others from the good run
        plan = make_plan(this, config_label(config), cfg.nightly.tasks, limit=limit, output=str(root),
                         run_id=run_dir.name, noise_floor=name == "good", variants=None if name == "good" else FAULT_VARIANT)
        reporter.step(f"[bold]simulation source[/] {name}: a real run of {cfg.nightly.tasks} (--limit {limit})")
        execute(plan, reporter, record=False)
        out.append(run_dir)
    return out[0], out[1]


def _copy_variant(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix in (".parquet", ".json"):
            try:
                os.link(f, dst / f.name)  # artifacts are never modified in place: a hard link is a copy
            except OSError:
                shutil.copy2(f, dst / f.name)


def build_night(good: Path, fault: Path, night_dir: Path, *, index: int, started_at: float, build: str, sp_from: str) -> Path:
    """One simulated night's run directory, compared and reported like a real one."""
    info = read_run_document(good) or RunDocument()
    if night_dir.exists():
        shutil.rmtree(night_dir)
    for name in info.variants:
        src = good / name
        if name == FAULT_VARIANT:
            src = fault / name if build == "fault" else good / sp_from
        _copy_variant(src, night_dir / name)
    if build != "fault" and sp_from != FAULT_VARIANT:
        info = _claim_source_path(info, sp_from)
    info = info.updated(run_id=night_dir.name, started_at=started_at, kind="nightly", status="ok",
                        components={"vllm_ascend": build},
                        simulated=SimulatedNight(night=index, sp_from="fault run" if build == "fault" else sp_from))
    write_run_document(RunDir(night_dir).run_json, info)
    comparison = compare_run(night_dir)
    info = info.updated(verdict=comparison.status)
    write_run_document(RunDir(night_dir).run_json, info)
    write_outputs(night_dir, comparison, info, plots=False)  # ~0.7 s a night saved; the dashboard is what is read
    return night_dir


def _claim_source_path(info: RunDocument, source: str) -> RunDocument:
    """The night's `sp` holds ``source``'s artifacts: it claims ``source``'s path (its
    expectations) so that the comparisons judge its probe records by what it ran."""
    settings = info.variant_settings
    expect = settings[source].expect if source in settings else None
    if FAULT_VARIANT not in settings or expect is None:
        return info
    return info.updated(variant_settings={**settings, FAULT_VARIANT: settings[FAULT_VARIANT].model_copy(update={"expect": expect})})


def simulate(reporter: Reporter, *, nights: int = 36, fault_night: int | None = 30, fix_night: int | None = 33, limit: int = 40,
             output: Path = Path("reports/simulated"), config: Path | None = None, seed: int = 0,
             history_url: str | None = None) -> SimulationSummary:
    if fault_night is not None and not (0 < fault_night < nights):
        raise UserError(f"--fault-night {fault_night} must lie between 1 and {nights - 1} (the nights before it are the A/A history).")
    if fault_night is not None and fix_night is not None and fix_night <= fault_night:
        raise UserError(f"--fix-night {fix_night} must come after --fault-night {fault_night}.")
    output = Path(output)
    good, fault = source_runs(config, limit, output / "sources", reporter)
    nights_dir = output / "nights"
    if nights_dir.exists():
        shutil.rmtree(nights_dir)
    db_path = output / "history.sqlite"
    if history_url is None:
        db_path.unlink(missing_ok=True)
    history = open_history(history_url or f"sqlite:///{db_path.resolve()}", output)
    aa_name = (read_run_document(good) or RunDocument()).aa_variant
    pool = [FAULT_VARIANT] + ([aa_name] if aa_name else [])
    rng = np.random.default_rng(seed)
    spec = load_config(config).nightly
    start = time.time() - nights * DAY
    results = []
    for i in range(nights):
        broken = fault_night is not None and i >= fault_night and (fix_night is None or i < fix_night)
        build = "fault" if broken else ("fixed" if fault_night is not None and i > fault_night else "good")
        sp_from = str(rng.choice(pool))
        night = build_night(good, fault, nights_dir / f"night-{i:02d}", index=i, started_at=start + i * DAY, build=build, sp_from=sp_from)
        r = record_and_judge(history, night, labels={}, alpha=spec.alpha, min_nights=spec.min_nights,
                             dashboard=output / "dashboard" / "index.html", title="evalpipe nightly: simulated history")
        results.append(r)
        mark = NIGHT_MARKS[r.judgement.status]
        reporter.info(f"night {i:2d} build {build:<6} sp={'fault run' if broken else sp_from:<10} {mark}")
    last = results[-1].judgement
    flagged = [c for c in last.changes if c.state == "flagged" and c.regression]
    summary = SimulationSummary(results, fault_night, fix_night, flagged)
    false_alarms = sum(1 for r in results[: fault_night if fault_night is not None else nights] if r.judgement.status is not NightStatus.PASS)
    a_a = fault_night if fault_night is not None else nights
    reporter.info(f"A/A nights: {a_a}, nights that were not PASS among them: {false_alarms} (false-alarm rate {false_alarms / max(a_a, 1):.2f})")
    for c in flagged:
        hint = ", ".join(f"{b.component} {b.before} → {b.after}" for b in c.bisect) or "no component changed"
        reporter.info(f"flagged: {c.summary}; between {c.last_good} and {c.first_bad}: {hint}", plain=True)
    reporter.info(f"history {history.where}; dashboard {output / 'dashboard' / 'index.html'}; "
                  + ("as expected: only the fault night is flagged" if summary.as_expected else
                     f"NOT as expected: flagged {summary.flagged_nights}"))
    return summary
