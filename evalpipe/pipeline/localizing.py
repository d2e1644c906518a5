"""`evalpipe localize RUN_DIR`: re-run the most divergent sequences through the reference,
the variant and the A/A configuration with capture points in their engines, and say in
which layer and module the variant first parts from the reference by more than the A/A.

Each configuration is the run's own (same interpreter, environment, engine arguments and
launch mode), with two changes: prefix caching off (a cached prefix is not computed
again, so its rows could not be captured) and no task: the worker prefills each chosen
sequence on its own (:class:`evalpipe.documents.worker_job.LocalizeJob`). The probe spec
carries the sequences and rows to keep; every engine process writes what its ranks hold
under ``RUN_DIR/localize/<configuration>/captures`` (:mod:`evalpipe.probes.capture`).
The comparison (:mod:`evalpipe.compare.localize`) goes to ``RUN_DIR/localize.json``,
report.md and report.html get a section, the terminal one sentence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from rich.markup import escape

from evalpipe.compare.localize import Boundaries, Localization, Side, localize
from evalpipe.compare.targets import Target, choose_targets
from evalpipe.config.errors import ConfigError
from evalpipe.config.run_config import RunConfig
from evalpipe.documents import localization as schema
from evalpipe.documents.captures import read_captures
from evalpipe.documents.comparison import Status, read_comparison
from evalpipe.documents.run_doc import RunDocument, RunModel, read_run_document
from evalpipe.documents.worker_job import LocalizeJob, LocalizeSequence, TeacherJob
from evalpipe.errors import RunFailed, UserError
from evalpipe.execution.preimport import Preimport
from evalpipe.pipeline.comparing import variant_numerics
from evalpipe.pipeline.jobs import worker_job
from evalpipe.pipeline.launching import Limits, run_variant, stop_unneeded
from evalpipe.pipeline.plan import PlannedVariant, RunPlan, make_plan
from evalpipe.pipeline.runner import ensure_model
from evalpipe.probing.names import VariantNames
from evalpipe.probing.records import write_spec
from evalpipe.report import render_html, render_markdown
from evalpipe.report.progress import ProgressView
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import RunDir, VariantDir
from evalpipe.rundir.integrity import verify_variant
from evalpipe.rundir.sequences import read_reference_sequences

LOCALIZE_DIR = "localize"  # RUN_DIR/localize/<configuration>/: job, logs, probe records, captures
CAPTURES = "captures"


@dataclasses.dataclass(frozen=True)
class Request:
    """What the user asked for (command line, or the config's `localize:` section)."""

    variants: tuple[str, ...] = ()  # none: the first DIVERGENT one
    samples: int | None = None
    positions: int | None = None
    decode_steps: int | None = None  # None: the config's


def localize_run(run_dir: Path, reporter: Reporter, request: Request = Request(),
                 limits: Limits = Limits(), starter: Preimport | None = None) -> list[schema.LocalizeDocument]:
    """Localize the requested variants of a run: the reference and the A/A configuration are
    started once for all of them, each variant once; localize.json and the reports updated.
    Returns the documents written (one per variant), so a caller need not read them back.
    ``starter``: a caller's pre-imported interpreters (kept running), else the call's own."""
    rd = RunDir(Path(run_dir))
    info = read_run_document(rd.root)
    if info is None:
        raise UserError(f"{rd.root} is not a run directory (no run.json there); give the directory `evalpipe run` wrote.")
    config = _config_of(info, rd)
    reference = info.reference or (info.variants[0] if info.variants else None)
    if reference is None:
        raise UserError(f"{rd.run_json} names no variant; run `evalpipe run` again.")
    aa_name = info.noise_floor_of(reference)
    variants = list(dict.fromkeys(request.variants)) or [_divergent_variant(rd)]
    others = [v for v in info.variants if v not in (reference, aa_name)]
    for variant in variants:
        if variant not in others:
            raise UserError(f"--variant {variant}: not a variant compared in {rd.root} (the reference is {reference}); "
                            f"choose one of: {', '.join(others) or 'none'}.")
    samples = request.samples or config.localize.samples
    positions = request.positions or config.localize.positions
    decode_steps = config.localize.decode_steps if request.decode_steps is None else request.decode_steps

    plan = _plan(config, info, rd, reference, variants, aa_name is not None)
    endpoint = [v.name for v in plan.variants if v.launch.mode == "endpoint"]
    if endpoint:
        raise UserError(f"localize cannot capture inside {', '.join(endpoint)}: in endpoint mode evalpipe does not start "
                        "the server, so it cannot put capture points into its engine; localize a serve-mode or offline run.")
    targets = _merged([_targets(rd, reference, v, config, samples, positions, decode_steps) for v in variants])
    reporter.step(f"[bold]localize[/] {', '.join(variants)} against {reference}"
                  + (f" and the A/A floor ({aa_name})" if aa_name else "") + f": {len(targets)} sequences, "
                  f"{sum(len(t.rows) for t in targets)} positions, {len(plan.variants)} engine starts")
    model = ensure_model(plan, reporter)

    seconds: dict[str, float] = {}
    sizes: dict[str, int] = {}
    sides: dict[str, Side] = {}
    view = ProgressView(reporter.console)
    with contextlib.nullcontext(starter) if starter is not None else Preimport() as starter:
        for planned in plan.variants:
            t0 = time.monotonic()
            sides[planned.name] = _capture(plan, planned, model, rd, targets, decode_steps, view, limits, reporter, starter)
            seconds[planned.name] = round(time.monotonic() - t0, 2)
            sizes[planned.name] = sum(p.values.nbytes for p in sides[planned.name].pieces)

    numerics = variant_numerics(VariantDir(rd.root / reference))
    docs = []
    for variant in variants:
        t0 = time.monotonic()
        result = localize(
            sides[reference], sides[variant], sides.get(aa_name) if aa_name else None,
            labels={i: t.label for i, t in enumerate(targets)}, tokens={i: len(t.token_ids) for i, t in enumerate(targets)},
            numerics_floor=numerics.localize_floor, rel_aa=config.localize.rel_aa,
            where=Boundaries(tp_sizes=_tp_sizes(config, plan), sparse_block=config.longctx.sparse_block),
        )
        used = [reference, *([aa_name] if aa_name else []), variant]
        modes: dict[str, Literal["offline", "serve"]] = {
            v.name: "serve" if v.launch.mode == "serve" else "offline" for v in plan.variants if v.name in used}
        docs.append(document(result, info, targets, modes=modes, dtype=numerics.dtype,
                             precision=numerics.precision,
                             seconds={**{n: seconds[n] for n in used}, "analysis": round(time.monotonic() - t0, 3)},
                             sizes={n: sizes[n] for n in used}))
    path, aside = schema.write_localizations(rd.root, docs)
    if aside is not None:
        reporter.warning(f"[yellow]warning:[/] the earlier {path.name} could not be read by this evalpipe; kept as {aside}")
    _render_reports(rd)
    for doc in docs:
        reporter.info(f"[bold]{escape(doc.variant)}[/]: {escape(doc.sentence)}", variant=doc.variant)
        for line in doc.not_reassembled:
            reporter.warning(f"[yellow]not compared:[/] {escape(line)}", variant=doc.variant)
    reporter.info(f"localization: {path}  (report.md and report.html beside it have the section)")
    return docs


def document(result: Localization, info: RunDocument, targets: list[Target], *, modes: dict[str, Literal["offline", "serve"]], dtype: str | None,
             precision: str, seconds: dict[str, float], sizes: dict[str, int]) -> schema.LocalizeDocument:
    return schema.LocalizeDocument(
        run_id=info.run_id, variant=result.variant, reference=result.reference, aa=result.aa,
        modes=modes, dtype=dtype, precision=precision,
        numerics_floor=result.numerics_floor, rel_aa=result.rel_aa, aa_identical=result.aa_identical,
        sequences=[schema.SequenceDoc(label=t.label, tokens=len(t.token_ids), rows=sorted(t.rows),
                                      why={str(k): v for k, v in t.rows.items()}) for t in targets],
        modules=list(result.modules),
        first=result.first,
        sentence=result.sentence(), layer_curve=result.layer_curve(), not_reassembled=result.not_reassembled(),
        seconds=seconds, capture_bytes=sizes,
    )


# ---------------------------------------------------------------------------


def _config_of(info: RunDocument, rd: RunDir) -> RunConfig:
    try:
        return RunConfig.model_validate(info.config)
    except ValueError as err:
        first = str(err).splitlines()[0]
        raise UserError(f"{rd.run_json}: its config cannot be read by this evalpipe ({first}); run `evalpipe run` again.") from None


def _divergent_variant(rd: RunDir) -> str:
    if not rd.compare_json.is_file():
        raise UserError(f"{rd.root} has no compare.json; compare the run first (`evalpipe compare {rd.root}`) or "
                        "name the variant with --variant.")
    comparisons = read_comparison(rd.compare_json).comparisons
    divergent = [c.variant for c in comparisons if c.status is Status.DIVERGENT]
    if not divergent:
        states = ", ".join(f"{c.variant} {c.status}" for c in comparisons) or "none"
        raise UserError(f"no variant of {rd.root} is DIVERGENT ({states}); name one with --variant to localize it anyway.")
    return divergent[0]


def _plan(config: RunConfig, info: RunDocument, rd: RunDir, reference: str, variants: list[str], noise_floor: bool) -> RunPlan:
    """The run's configurations, re-planned from its run.json: reference, A/A, variants."""
    config = config.model_copy(update={"reference": reference})
    # the run's own A/A settings when its config has them (else --noise-floor made it: the defaults)
    configured = config.noise_floor is not None and config.noise_floor.enabled
    try:
        plan = make_plan(config, info.config_path or str(rd.run_json), info.task_selector or "all",
                         variants=",".join([reference, *variants]), output=str(rd.root.parent), run_id=info.run_id or rd.root.name,
                         noise_floor=None if noise_floor and configured else noise_floor)
    except ConfigError as err:
        raise UserError(f"cannot start {rd.root}'s configurations again: {err}") from None
    # prefix caching off: a cached prefix is not computed again, so its rows could not be
    # captured. The A/A runs an engine of its own: a server it shared would mix its captures
    # with the reference's.
    plan.variants = [
        dataclasses.replace(v, engine_args={**v.engine_args, "enable_prefix_caching": False}, server_of=None)
        for v in plan.variants
    ]
    return plan


def _targets(rd: RunDir, reference: str, variant: str, config: RunConfig, samples: int, positions: int,
             decode_steps: int) -> list[Target]:
    tables = []
    for name in (reference, variant):
        # what is read must be what the variant wrote: a variant without its manifest is refused as compare refuses it
        verify_variant(VariantDir(rd.root / name))
        path = VariantDir(rd.root / name).teacher
        if not path.is_file():
            raise UserError(f"localize needs the teacher-forced scores of {name} ({path} is missing); run with "
                            "capture.teacher_forcing: true.")
        tables.append(artifacts.read_table(path))
    sequences = read_reference_sequences(rd.root / reference)
    targets = choose_targets(sequences, tables[0], tables[1], samples=samples, positions=positions,
                             tp_sizes=tuple(config.longctx.tp_sizes), sparse_block=config.longctx.sparse_block,
                             decode_steps=decode_steps)
    if not targets:
        raise UserError(f"{rd.root}: {variant} and {reference} share no teacher-forced sequence; nothing to localize.")
    return targets


def _merged(per_variant: list[list[Target]]) -> list[Target]:
    """One list of sequences for every configuration: each variant's most divergent ones,
    with the rows any of them keeps (the reference's captures then serve them all)."""
    merged: dict[tuple[str, int, int], Target] = {}
    for targets in per_variant:
        for t in targets:
            known = merged.get(t.key)
            if known is None:
                merged[t.key] = t
                continue
            rows = {r: list(dict.fromkeys(known.rows.get(r, []) + t.rows.get(r, []))) for r in known.rows.keys() | t.rows.keys()}
            merged[t.key] = dataclasses.replace(known, rows=dict(sorted(rows.items())),
                                                divergence=max(known.divergence, t.divergence))
    return list(merged.values())


def _tp_sizes(config: RunConfig, plan: RunPlan) -> tuple[int, ...]:
    sizes = set(config.longctx.tp_sizes)
    for v in plan.variants:
        tp = v.engine_args.get("tensor_parallel_size")
        if isinstance(tp, int) and tp > 1:
            sizes.add(tp)
    return tuple(sorted(sizes))


def _capture(plan: RunPlan, planned: PlannedVariant, model: RunModel, rd: RunDir, targets: list[Target],
             decode_steps: int, view: ProgressView, limits: Limits, reporter: Reporter, starter: Preimport) -> Side:
    """One configuration's engine started (its server stopped again before the next one's
    starts), the sequences prefilled, its captures read."""
    vdir = rd.root / LOCALIZE_DIR / planned.name
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir(parents=True)
    captures = vdir / CAPTURES
    spec = write_spec(vdir, planned.name, VariantNames(), capture={
        "dir": str(captures),
        "sequences": [{"label": t.label, "token_ids": t.token_ids, "rows": sorted(t.rows)} for t in targets],
    })
    job = worker_job(plan, planned.name, model, vdir).model_copy(update={
        "tasks": [], "journal": None, "teacher": TeacherJob(),
        "localize": LocalizeJob(sequences=[LocalizeSequence(label=t.label, token_ids=t.token_ids, prompt_len=t.prompt_len)
                                           for t in targets], decode_steps=decode_steps),
    })
    reporter.step(f"[bold cyan]configuration {planned.name}[/] {escape(planned.description)}".rstrip(), variant=planned.name)
    servers: dict[str, Any] = {}
    try:
        outcome = run_variant(plan, planned, model, vdir, view.handle(planned.name), limits, servers, spec=spec, job=job,
                              starter=starter)
    finally:
        view.close()
        stop_unneeded(servers, [])
    if not outcome.ok:
        raise RunFailed(f"localize: configuration {planned.name} failed ({outcome.error}); its logs are in {vdir}.")
    pieces = read_captures(captures)
    if not pieces:
        raise RunFailed(f"localize: configuration {planned.name} captured nothing: no forward pass held one of the "
                        f"chosen sequences alone (see {vdir}); is the engine's model the run's?")
    return Side(planned.name, pieces)


def _render_reports(rd: RunDir) -> None:
    """report.md and report.html again, with the localizations (compare.json unchanged)."""
    if not rd.compare_json.is_file():
        return
    data = read_comparison(rd.compare_json)
    header = read_run_document(rd.root) or RunDocument()
    found = schema.read_localizations(rd.root)  # just written: readable
    artifacts.write_text(rd.report_md, render_markdown(data, header, localizations=found))
    artifacts.write_text(rd.report_html, render_html(data, header, localizations=found))
