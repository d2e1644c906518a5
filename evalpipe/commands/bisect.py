"""`evalpipe bisect -c CONFIG --good REF --bad REF`: the first build that changed the outputs.

The candidates are the commits of the config's ``bisect.repo`` between the two refs
(:mod:`evalpipe.bisection.candidates`). Every build runs as the config's searched variant with
its tree first on PYTHONPATH. The good build runs once with its A/A run (kept under the
output root by commit, config and items, so a later bisect from the same good commit
reuses it); every step then runs one build and compares it with that reference, bounded by
that A/A floor, judged by the run's own gates:

- IDENTICAL or EQUIVALENT: SAME; DIVERGENT: DIFFERENT (token evidence counts: no score
  need move); INCONCLUSIVE: UNKNOWN; a build that does not run: SKIP, with its reason.
- A DIFFERENT build runs again (``bisect.confirm``); two runs that differ from each other
  beyond the good build's floor make it UNKNOWN: a build that does not repeat itself is
  never blamed on one run.
- UNKNOWN reruns at each level of ``bisect.escalate`` (more items, more samples); past the last, SKIP.

The bad end is verified first; a bad end that is SAME is reported, not bisected. The search
(:mod:`evalpipe.bisection.search`) goes around skipped builds. bisect.json is rewritten after
every run: kill the command, run it again, and it continues.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from evalpipe.bisection.candidates import BuildFailed, build, candidates, checkout
from evalpipe.bisection.levels import Level, escalation_problem, levels
from evalpipe.bisection.search import bounds, expected_steps, next_candidate, suspects
from evalpipe.config.bisect import BisectSpec
from evalpipe.config.loading import load_config
from evalpipe.config.merge import deep_merge
from evalpipe.config.option_bounds import check_option
from evalpipe.config.run_config import LaunchFields, NoiseFloor, RunConfig, TaskSpec, Variant
from evalpipe.documents.bisect import (
    BISECT_JSON,
    STEP_OF_STATUS,
    Answer,
    Attempt,
    BisectJournal,
    Candidate,
    Evidence,
    Step,
    StepVerdict,
    read_journal,
    short,
    write_journal,
)
from evalpipe.documents.comparison import Comparison, GateStatus
from evalpipe.documents.run_doc import RunStatus, read_run_document
from evalpipe.errors import EvalpipeError, ExitCode, RunFailed, UserError
from evalpipe.execution.preimport import Preimport
from evalpipe.install import default_config
from evalpipe.pipeline.comparing import compare_with_reference_run, write_outputs
from evalpipe.pipeline.launching import Limits
from evalpipe.pipeline.localizing import Request, localize_run
from evalpipe.pipeline.plan import make_plan
from evalpipe.pipeline.runner import execute
from evalpipe.report.bisect import bisect_table, source, write_bisect_reports
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts

CANDIDATE = "candidate"


@dataclass(frozen=True)
class BisectRequest:
    config: Path | None
    good: str
    bad: str
    tasks: str = "gsm8k"
    limit: int | None = None
    output: Path | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class Bisection:
    """What every step needs: the config, where the builds come from, where runs go."""

    request: BisectRequest
    config_path: str
    config: RunConfig
    spec: BisectSpec
    repo: Path | None  # None: an explicit list of builds
    variant: str
    root: Path
    reporter: Reporter
    # the pre-imported interpreters every run's workers fork from (None: each run its own)
    starter: Preimport | None = None

    @property
    def mark(self) -> str:
        """In the environment of every process the bisect starts (RUN_ID_ENV)."""
        return f"bisect-{self.root.name}"

    @property
    def cache(self) -> Path:
        return self.root.parent / "trees"

    def tree(self, commit: str) -> Path:
        """The commit's tree, built when the config names a build command (BuildFailed)."""
        assert self.repo is not None, "a list of builds has no trees"
        tree = checkout(self.repo, commit, self.cache)
        build(tree, self.spec.build or [])
        return tree

    def built(self, key: str) -> Variant:
        """The searched variant as candidate ``key`` builds it: a commit's tree first on its
        PYTHONPATH, or a listed build's env, interpreter and launch over its own."""
        variant = self.config.variants[self.variant]
        if self.spec.builds is not None:
            listed = self.spec.build_named(key)
            return variant.model_copy(update={"env": {**variant.env, **listed.env}, "python": listed.python or variant.python,
                                              "launch": deep_merge(variant.launch, listed.launch)})
        tree = self.tree(key)
        inherited = variant.env.get("PYTHONPATH") or self.config.env.get("PYTHONPATH", "")
        paths = [str((tree / p).resolve()) for p in self.spec.pythonpath]
        env = {**variant.env, "PYTHONPATH": os.pathsep.join([*paths, *([inherited] if inherited else [])])}
        return variant.model_copy(update={"env": env})

    def build_config(self, variants: dict[str, Variant], *, floor: bool, samples: int | None = None) -> RunConfig:
        """The config with these builds of the searched variant, the first the reference;
        ``samples``: per item, in place of the config's (an escalation's)."""
        config = self.config
        if samples is not None:
            more = {"samples": samples}
            config = config.model_copy(update={
                "sampling": config.sampling.model_copy(update=more) if config.sampling else None,
                "tasks": {group: [t.model_copy(update={"sampling": t.sampling.model_copy(update=more)}) if t.sampling else t
                                  for t in specs] for group, specs in config.tasks.items()},
            })
        # a run of builds, no longer a bisect: its run.json must read back as a config of its own
        return config.model_copy(update={
            "variants": variants, "reference": next(iter(variants)), "bisect": None,
            "noise_floor": (config.noise_floor or NoiseFloor()) if floor else None,
        })

    def run(self, key: str, name: str, run_id: str, level: Level, *, floor: bool) -> Path:
        """One run of candidate ``key``'s build as variant ``name`` at ``level``; a directory a
        killed bisect left half-written is run again. RunFailed when the build does not run."""
        plan = make_plan(self.build_config({name: self.built(key)}, floor=floor, samples=level.samples), self.config_path,
                         self.request.tasks, limit=level.limit,
                         output=str(self.root / "runs" if not floor else self.root.parent / "good"),
                         run_id=run_id, noise_floor=floor, process_mark=self.mark)
        if plan.run_dir.is_dir():
            if _finished(plan.run_dir):
                return plan.run_dir
            shutil.rmtree(plan.run_dir)
        execute(plan, self.reporter, self.request.timeout_s, compared_elsewhere=True, starter=self.starter)
        return plan.run_dir


def _finished(run_dir: Path) -> bool:
    try:
        doc = read_run_document(run_dir / artifacts.RUN_JSON)
    except EvalpipeError:
        return False
    return doc is not None and doc.status is RunStatus.OK


def listed_candidates(spec: BisectSpec, good: str, bad: str) -> tuple[str, list[Candidate]]:
    """The listed builds after --good up to --bad, by name, in the list's order."""
    names = [b.name for b in spec.builds or []]
    for option, name in (("--good", good), ("--bad", bad)):
        if name not in names:
            raise UserError(f"{option} {name}: no build of that name in bisect.builds; give one of: {', '.join(names)}.")
    if good == bad:
        raise UserError(f"--good and --bad both name build {good}; pass a good build listed before the bad one.")
    first, last = names.index(good), names.index(bad)
    if first > last:
        raise UserError(f"--good {good} comes after --bad {bad} in bisect.builds (oldest first); swap them.")
    return good, [Candidate(commit=b.name, subject=b.description or b.name) for b in (spec.builds or [])[first + 1: last + 1]]


def _repo(given: str, config_path: str) -> Path:
    repo = Path(given).expanduser()
    return repo if repo.is_absolute() else (Path(config_path).resolve().parent / repo)


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:10]


def prepare(request: BisectRequest, reporter: Reporter) -> tuple[Bisection, BisectJournal]:
    """Everything checked before anything starts: the config, its `bisect:` section, the
    refs and the tasks (a plan of the good build)."""
    check_option("--limit", request.limit, TaskSpec, "limit", "tasks.<group>[].limit")
    check_option("--timeout", request.timeout_s, LaunchFields, "ready_timeout_s", "launch.ready_timeout_s")
    config_path = str(request.config or default_config())
    config = load_config(config_path)
    if config.bisect is None:
        raise UserError(f"{config_path} has no `bisect:` section; add one with `repo:` naming the git repository "
                        "the variant takes its code from (docs/bisect.md).")
    spec = config.bisect
    if request.tasks in config.tasks:  # an unknown group is the plan's to refuse, below
        problem = escalation_problem(request.limit, spec.escalate, [config.task_sampling(t) for t in config.tasks[request.tasks]])
        if problem is not None:
            raise UserError(f"bisect.escalate in {config_path} {problem}.")
    variant = spec.variant or config.reference_name
    repo = _repo(spec.repo, config_path) if spec.repo is not None else None
    if repo is not None:
        good_key, found = candidates(repo, request.good, request.bad, first_parent=spec.first_parent)
    else:
        good_key, found = listed_candidates(spec, request.good, request.bad)
    output = request.output or Path(config.output).expanduser().parent / "bisect"
    root = output / f"{short(good_key)}-{short(found[-1].commit)}-{_key(config_path, config.model_dump_json(), request.tasks, request.limit)}"
    bisection = Bisection(request, config_path, config, spec, repo.resolve() if repo else None, variant, root, reporter)
    try:
        good_variant = bisection.built(good_key)
    except BuildFailed as err:
        raise UserError(f"the good end {short(good_key)} does not build ({err}); fix bisect.build or pass another --good.") from None
    # the tasks, limits and variant as a run would plan them: refused here, not after the good build ran
    make_plan(bisection.build_config({variant: good_variant}, floor=True), config_path, request.tasks, limit=request.limit,
              output=str(root / "runs"), run_id="check", noise_floor=True)
    journal_path = root / BISECT_JSON
    if journal_path.is_file():
        journal = read_journal(journal_path)
        reporter.step(f"[bold]continuing[/] the bisect in {root}: {journal.runs()} runs kept")
    else:
        journal = BisectJournal(config=config_path, repo=str(repo.resolve()) if repo else None, variant=variant,
                                good=good_key, bad=found[-1].commit, candidates=found)
    return bisection, journal


def _evidence(comparison: Comparison) -> Evidence:
    firsts = [t.median_first_divergence for t in comparison.tokens if t.median_first_divergence is not None]
    kls = [t.kl_p99 for t in (comparison.teacher or []) if t.kl_p99 is not None]
    return Evidence(
        first_divergence=int(min(firsts)) if firsts else None,
        kl_p99=max(kls) if kls else None,
        flipped=max((s.n_changed for s in comparison.scores), default=0),
        failed_gates=sorted({g.gate for g in comparison.gates if g.status is GateStatus.FAIL}),
    )


class Searcher:
    def __init__(self, bisection: Bisection, journal: BisectJournal):
        self.b = bisection
        self.journal = journal
        self.t0 = time.monotonic() - journal.seconds
        self.good_runs: dict[Level, Path] = {}
        self.levels = levels(bisection.request.limit, bisection.spec.escalate)

    def save(self) -> None:
        self.journal = self.journal.model_copy(update={"seconds": round(time.monotonic() - self.t0, 1)})
        write_journal(self.b.root / BISECT_JSON, self.journal)

    def good_run(self, level: Level) -> Path:
        """The good build with its A/A run (the floor of every step) at ``level``; a good build
        that does not run stops the bisect (UserError)."""
        if level in self.good_runs:
            return self.good_runs[level]
        b = self.b
        key = str(level.limit or "all") + (f"x{level.samples}" if level.samples else "")
        at = level.limit if level.samples is None else (level.limit, level.samples)  # the key of runs before samples escalated
        run_id = f"{short(self.journal.good)}-{_key(b.config_path, b.config.model_dump_json(), b.request.tasks, at)}-{key}"
        b.reporter.step(f"[bold]good build[/] {short(self.journal.good)} with its A/A run ({level.label()})")
        try:
            run_dir = b.run(self.journal.good, "good", run_id, level, floor=True)
        except (RunFailed, BuildFailed) as err:
            raise UserError(f"the good build {short(self.journal.good)} did not run ({str(err).splitlines()[0]}); "
                            "a bisect needs a good end that works: pass another --good.") from None
        self.good_runs[level] = run_dir
        return run_dir

    def attempt(self, commit: str, level: Level, number: int, good: Path, repeat_of: str | None = None) -> Attempt:
        b = self.b
        run_id = f"{short(commit)}-{number}"
        try:
            run_dir = b.run(commit, CANDIDATE, run_id, level, floor=False)
        except (RunFailed, BuildFailed) as err:
            reason = f"the build did not run: {str(err).splitlines()[0]}"
            return Attempt(run_dir=str(b.root / "runs" / run_id), limit=level.limit, samples=level.samples, status=None,
                           verdict=StepVerdict.SKIP, reason=reason, repeat_of=repeat_of)
        comparison = compare_with_reference_run(good, run_dir / CANDIDATE, label=short(commit))
        write_outputs(run_dir, comparison, plots=False)
        doc = comparison.doc.comparisons[0]
        return Attempt(run_dir=str(run_dir), limit=level.limit, samples=level.samples, status=doc.status, verdict=STEP_OF_STATUS[doc.status],
                       reason="; ".join(doc.reasons[:2]), evidence=_evidence(doc), repeat_of=repeat_of)

    def repeats(self, first: Attempt, second: Attempt, good: Path) -> bool:
        """The build's two runs agree within the good build's A/A floor."""
        comparison = compare_with_reference_run(good, Path(second.run_dir) / CANDIDATE, label="repeat",
                                                against=Path(first.run_dir) / CANDIDATE)
        return comparison.status.passed

    def step(self, index: int, *, endpoint: bool = False) -> Step:
        cand = self.journal.candidates[index]
        label = f"{short(cand.commit)} {cand.subject}"
        b = self.b
        attempts: list[Attempt] = list(prev.attempts) if (prev := self.journal.step(cand.commit)) else []
        reason = ""
        for escalated, level in enumerate(self.levels):
            done = [a for a in attempts if (a.limit, a.samples) == (level.limit, level.samples)]
            b.reporter.step(f"[bold]step[/] {label} ({level.label()}{', escalated' if escalated else ''})", commit=cand.commit)
            good = self.good_run(level)
            first = done[0] if done else self._record(cand.commit, attempts, self.attempt(cand.commit, level, len(attempts) + 1, good))
            if first.verdict in (StepVerdict.SAME, StepVerdict.SKIP):
                return self._decided(cand.commit, attempts, first.verdict, first.reason, endpoint)
            if first.verdict is StepVerdict.DIFFERENT:
                if not b.spec.confirm:
                    return self._decided(cand.commit, attempts, StepVerdict.DIFFERENT, first.reason, endpoint)
                second = done[1] if len(done) > 1 else self._record(
                    cand.commit, attempts, self.attempt(cand.commit, level, len(attempts) + 1, good, repeat_of=first.run_dir))
                if second.verdict is StepVerdict.DIFFERENT and self.repeats(first, second, good):
                    return self._decided(cand.commit, attempts, StepVerdict.DIFFERENT,
                                         f"confirmed by a second run; {first.reason}", endpoint)
                reason = ("its second run was not DIFFERENT" if second.verdict is not StepVerdict.DIFFERENT else
                          "its two runs differ from each other beyond the good build's A/A floor: it does not repeat itself")
            else:
                reason = first.reason
            b.reporter.info(f"[yellow]UNKNOWN[/] {label}: {reason}")
        return self._decided(cand.commit, attempts, StepVerdict.SKIP,
                             f"UNKNOWN after {len(attempts)} runs ({reason}); skipped as `git bisect skip` does", endpoint)

    def _record(self, commit: str, attempts: list[Attempt], attempt: Attempt) -> Attempt:
        attempts.append(attempt)
        self.journal = self.journal.with_step(Step(commit=commit, attempts=list(attempts), verdict=StepVerdict.UNKNOWN,
                                                   reason="in progress"))
        self.save()
        return attempt

    def _decided(self, commit: str, attempts: list[Attempt], verdict: StepVerdict, reason: str, endpoint: bool) -> Step:
        step = Step(commit=commit, attempts=list(attempts), verdict=verdict, reason=reason, endpoint=endpoint)
        self.journal = self.journal.with_step(step)
        self.save()
        self.b.reporter.step(f"[bold]{verdict}[/] {short(commit)}: {reason}", commit=commit, verdict=str(verdict))
        return step

    def localize(self, answer: Answer) -> Answer:
        """The first DIFFERENT build against the newest SAME build before it (its parent,
        unless that one was skipped): one run of the two, then `evalpipe localize` on it."""
        b = self.b
        count = len(self.journal.candidates)
        last_same = bounds(self.journal.verdicts(), count).last_same
        parent = self.journal.good if last_same < 0 else self.journal.candidates[last_same].commit
        culprit = str(answer.first_different)
        b.reporter.step(f"[bold]localize[/] {short(culprit)} against {short(parent)}")
        cfg = b.build_config({"parent": b.built(parent), "first_different": b.built(culprit)}, floor=False)
        plan = make_plan(cfg, b.config_path, b.request.tasks, limit=b.request.limit, output=str(b.root / "runs"),
                         run_id="localize", noise_floor=False, process_mark=b.mark)
        if not plan.run_dir.is_dir() or not _finished(plan.run_dir):
            if plan.run_dir.is_dir():
                shutil.rmtree(plan.run_dir)
            execute(plan, b.reporter, b.request.timeout_s, starter=b.starter)
        docs = localize_run(plan.run_dir, b.reporter, Request(("first_different",)), Limits(timeout_s=b.request.timeout_s))
        sentence = docs[0].sentence if docs else "nothing to localize: the two builds did not differ in this run"
        return answer.model_copy(update={"localize_dir": str(plan.run_dir), "localized": sentence})

    def search(self) -> Answer:
        count = len(self.journal.candidates)
        self.good_run(self.levels[0])
        bad = self.step(count - 1, endpoint=True)
        if bad.verdict is StepVerdict.SAME:
            return Answer(kind="bad_is_same", sentence=f"the bad end {short(bad.commit)} is SAME as the good build: there is "
                          "nothing to bisect (the change is not in these builds, or the gates cannot see it).")
        if bad.verdict is not StepVerdict.DIFFERENT:
            return Answer(kind="bad_not_different", sentence=f"the bad end {short(bad.commit)} is {bad.verdict} ({bad.reason}); "
                          "pass a bad commit that runs and differs.")
        while (index := next_candidate(self.journal.verdicts(), count)) is not None:
            self.step(index)
        found = suspects(self.journal.verdicts(), count)
        commits = [self.journal.candidates[i] for i in found]
        first = commits[-1]
        if len(commits) == 1:
            sentence = f"the first DIFFERENT build is {short(first.commit)} \"{first.subject}\""
            return Answer(kind="found", sentence=sentence, first_different=first.commit)
        skipped = ", ".join(short(c.commit) for c in commits[:-1])
        return Answer(kind="ambiguous", first_different=first.commit, could_be=[c.commit for c in commits],
                      sentence=f"the first DIFFERENT build is {short(first.commit)} or one of the skipped builds before it ({skipped})")


def shared_starter(spec: BisectSpec) -> Preimport | None:
    """One set of pre-imported interpreters for all the bisect's runs, unless a build step runs
    between them: it may install into the interpreter what a server imported before it."""
    return Preimport() if not spec.build else None


def bisect_command(request: BisectRequest, reporter: Reporter) -> int:
    """0: the first DIFFERENT build named; 4: no one build named (the answer is one of several
    skipped builds, the bad end is SAME, or it could not be tested)."""
    bisection, journal = prepare(request, reporter)
    bisection.root.mkdir(parents=True, exist_ok=True)
    starter = shared_starter(bisection.spec)
    try:
        return _bisect(dataclasses.replace(bisection, starter=starter), journal, reporter)
    finally:
        if starter is not None:
            starter.close()


def _bisect(bisection: Bisection, journal: BisectJournal, reporter: Reporter) -> int:
    count = len(journal.candidates)
    reporter.step(f"[bold]bisect[/] {count} candidate builds of {escape(source(journal))} ({short(journal.good)}..{short(journal.bad)}); "
                  f"about {expected_steps(count)} runs without skips or escalations -> {bisection.root}")
    searcher = Searcher(bisection, journal)
    if journal.answer is None:
        found = searcher.search()  # before the copy: the search itself adds every step to the journal
        if found.first_different is not None and bisection.spec.localize:
            try:
                found = searcher.localize(found)
            except EvalpipeError as err:  # the answer stands without it
                reporter.warning(f"[yellow]warning:[/] localizing {short(str(found.first_different))} failed: {escape(str(err))}")
        searcher.journal = searcher.journal.model_copy(update={"answer": found})
        searcher.save()
    journal = searcher.journal
    written = write_bisect_reports(bisection.root, journal)
    reporter.table(*bisect_table(journal))
    if journal.answer is None:
        raise RunFailed(f"the bisect in {bisection.root} ended without an answer; run it again to continue.")
    reporter.info(f"[bold]{escape(journal.answer.sentence)}[/]")
    for path in written:
        reporter.info(f"report: {path}")
    code = ExitCode.OK if journal.answer.kind == "found" else ExitCode.INCONCLUSIVE
    reporter.verdict(journal.answer.kind.upper(), code, bisection.root)
    return code


