"""evalpipe/commands/bisect.py: bad input refused in one sentence before anything starts, and
each step's rules (confirm a DIFFERENT build, escalate an UNKNOWN one, skip a broken one)
against scripted run outcomes."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
import yaml
from git_repos import linear_repo
from rich.console import Console

from evalpipe.commands.bisect import BisectRequest, Searcher, prepare, shared_starter
from evalpipe.documents.bisect import Attempt, StepVerdict
from evalpipe.documents.comparison import Status
from evalpipe.errors import UserError
from evalpipe.install import shipped_dir
from evalpipe.process_table import RUN_ID_ENV
from evalpipe.reporting import TerminalReporter


def _reporter() -> TerminalReporter:
    return TerminalReporter(Console(file=io.StringIO(), width=200))


@pytest.fixture
def setup(tmp_path):
    repo = linear_repo(tmp_path / "repo", 6)

    def config(section: bool = True, **bisect) -> Path:
        path = tmp_path / f"bisect{len(list(tmp_path.glob('bisect*.yaml')))}.yaml"
        body = {"extends": str(shipped_dir("configs") / "default.yaml"), "output": str(tmp_path / "runs")}
        if section:
            body["bisect"] = {"repo": str(repo), "variant": "sp", **bisect}
        path.write_text(yaml.safe_dump(body))
        return path

    return repo, config, tmp_path


@pytest.mark.parametrize(("good", "bad", "bisect", "extra", "words"), [
    ("HEAD~5", "HEAD", None, {}, "has no `bisect:` section"),
    ("HEAD~9", "HEAD", {}, {}, "--good HEAD~9: no such commit"),
    ("HEAD", "HEAD", {}, {}, "are the same commit"),
    ("HEAD", "HEAD~5", {}, {}, "is not an ancestor of --bad"),
    ("HEAD~5", "HEAD", {"escalate": [20, 40]}, {"limit": 20}, "must be larger than --limit 20"),
    ("HEAD~5", "HEAD", {"escalate": [{"samples": 4}]}, {"limit": 20}, "decodes greedily"),
    ("HEAD~5", "HEAD", {"build": ["false"]}, {}, "does not build .*the build command exited 1"),
    ("HEAD~5", "HEAD", {"variant": "nosuch"}, {}, "nosuch"),
    ("HEAD~5", "HEAD", {}, {"limit": 0}, "--limit 0 is out of range"),
])
def test_bad_input_is_one_sentence_and_nothing_is_written(setup, good, bad, bisect, extra, words):
    repo, config, tmp = setup
    path = config(**bisect) if bisect is not None else config(section=False)
    with pytest.raises(UserError, match=words):
        prepare(BisectRequest(path, good, bad, **extra), _reporter())
    assert not list(tmp.rglob("bisect.json")) and not list(tmp.rglob("run.json")), "nothing ran, no journal"


def test_a_repository_with_uncommitted_changes_is_refused(setup):
    repo, config, _ = setup
    (repo / "plugin.py").write_text("REVISION = 'local edit'\n")
    with pytest.raises(UserError, match="uncommitted changes"):
        prepare(BisectRequest(config(), "HEAD~5", "HEAD"), _reporter())


def test_every_run_of_a_bisect_forks_from_one_starter_and_carries_the_bisect_s_mark(setup, monkeypatch):
    from evalpipe.bisection.levels import Level
    from evalpipe.commands import bisect as command

    repo, config, _ = setup
    assert shared_starter(prepare(BisectRequest(config(build=["true"]), "HEAD~5", "HEAD"), _reporter())[0].spec) is None
    bisection, journal = prepare(BisectRequest(config(), "HEAD~5", "HEAD", limit=10), _reporter())
    shared = shared_starter(bisection.spec)
    assert shared is not None
    bisection = dataclasses.replace(bisection, starter=shared)
    started = []
    monkeypatch.setattr(command, "execute", lambda plan, reporter, timeout_s, **kw: started.append((plan, kw["starter"])))
    bisection.run(journal.good, "good", "good-run", Level(10), floor=True)
    bisection.run(journal.candidates[0].commit, "candidate", "step-run", Level(10), floor=False)
    assert [plan.run_id for plan, _ in started] == ["good-run", "step-run"]
    assert all(starter is shared for _, starter in started)
    marks = {v.process_env()[RUN_ID_ENV] for plan, _ in started for v in plan.variants}
    assert marks == {bisection.mark}, "a run's mark would make the shared server refuse its workers"
    shared.close()


def _attempt(verdict: StepVerdict, n: int, limit=None, samples=None) -> Attempt:
    status = {StepVerdict.SAME: Status.EQUIVALENT, StepVerdict.DIFFERENT: Status.DIVERGENT,
              StepVerdict.UNKNOWN: Status.INCONCLUSIVE, StepVerdict.SKIP: None}[verdict]
    return Attempt(run_dir=f"/runs/{n}", limit=limit, samples=samples, status=status, verdict=verdict, reason=f"run {n} {verdict}")


class Scripted(Searcher):
    """The step rules against scripted outcomes: each run's verdict, and whether two runs of a build agree."""

    def __init__(self, bisection, journal, outcomes: list[StepVerdict], repeats: bool = True):
        super().__init__(bisection, journal)
        self.outcomes, self.repeat_answer, self.limits, self.goods = list(outcomes), repeats, [], []

    def good_run(self, level):
        self.goods.append(level)
        return Path("/good")

    def attempt(self, commit, level, number, good, repeat_of=None):
        self.limits.append(level.limit if level.samples is None else (level.limit, level.samples))
        return _attempt(self.outcomes.pop(0), number, level.limit, level.samples)

    def repeats(self, first, second, good):
        return self.repeat_answer


@pytest.mark.parametrize(("outcomes", "repeats", "escalate", "verdict", "runs", "words"), [
    ([StepVerdict.SAME], True, [], StepVerdict.SAME, 1, "SAME"),
    ([StepVerdict.SKIP], True, [], StepVerdict.SKIP, 1, "SKIP"),
    ([StepVerdict.DIFFERENT, StepVerdict.DIFFERENT], True, [], StepVerdict.DIFFERENT, 2, "confirmed by a second run"),
    # a build that does not repeat itself is never blamed: UNKNOWN, then skipped
    ([StepVerdict.DIFFERENT, StepVerdict.DIFFERENT], False, [], StepVerdict.SKIP, 2, "does not repeat itself"),
    ([StepVerdict.DIFFERENT, StepVerdict.SAME], True, [], StepVerdict.SKIP, 2, "second run was not DIFFERENT"),
    # UNKNOWN escalates to the larger limits, then is skipped
    ([StepVerdict.UNKNOWN, StepVerdict.UNKNOWN, StepVerdict.UNKNOWN], True, [20, 40], StepVerdict.SKIP, 3, "UNKNOWN after 3 runs"),
    ([StepVerdict.UNKNOWN, StepVerdict.SAME], True, [20, 40], StepVerdict.SAME, 2, "SAME"),
])
def test_each_steps_rules(setup, outcomes, repeats, escalate, verdict, runs, words):
    repo, config, _ = setup
    bisection, journal = prepare(BisectRequest(config(escalate=escalate), "HEAD~5", "HEAD", limit=10), _reporter())
    bisection.root.mkdir(parents=True)
    searcher = Scripted(bisection, journal, outcomes, repeats)
    step = searcher.step(2)
    assert step.verdict is verdict and len(step.attempts) == runs
    assert words in step.reason or words == str(verdict)
    assert searcher.limits == ([10, 20, 40][:runs] if escalate and outcomes[0] is StepVerdict.UNKNOWN else [10] * runs)
    assert not searcher.outcomes, "every scripted run was used"


def test_an_unknown_step_of_a_sampled_config_escalates_to_more_samples_against_a_good_run_with_as_many(setup):
    repo, config, tmp = setup
    path = tmp / "sampled.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(config(escalate=[{"samples": 4}, 40]).read_text()),
                                    "sampling": {"temperature": 0.6, "samples": 2}}))
    bisection, journal = prepare(BisectRequest(path, "HEAD~5", "HEAD", limit=10), _reporter())
    bisection.root.mkdir(parents=True)
    searcher = Scripted(bisection, journal, [StepVerdict.UNKNOWN, StepVerdict.UNKNOWN, StepVerdict.SAME])
    step = searcher.step(2)
    assert step.verdict is StepVerdict.SAME and searcher.limits == [10, (10, 4), (40, 4)]
    assert [(g.limit, g.samples) for g in searcher.goods] == [(10, None), (10, 4), (40, 4)]
    assert [(a.limit, a.samples) for a in step.attempts] == [(10, None), (10, 4), (40, 4)]
    # continued from its journal, the step runs nothing again: each attempt is found at its level
    assert Scripted(bisection, searcher.journal, []).step(2).verdict is StepVerdict.SAME
    sampled = bisection.build_config({"b": bisection.built(journal.good)}, floor=False, samples=4)
    assert sampled.sampling is not None and sampled.sampling.samples == 4 and bisection.config.sampling.samples == 2


def test_the_search_verifies_the_bad_end_first_and_reports_a_bad_end_that_is_same(setup):
    repo, config, _ = setup
    bisection, journal = prepare(BisectRequest(config(), "HEAD~5", "HEAD", limit=10), _reporter())
    bisection.root.mkdir(parents=True)
    answer = Scripted(bisection, journal, [StepVerdict.SAME]).search()
    assert answer.kind == "bad_is_same" and "nothing to bisect" in answer.sentence


def test_the_search_finds_the_first_different_build_around_a_skipped_one_and_continues_from_its_journal(setup):
    repo, config, _ = setup
    path = config(confirm=False)
    bisection, journal = prepare(BisectRequest(path, "HEAD~5", "HEAD", limit=10), _reporter())
    bisection.root.mkdir(parents=True)
    # candidates 0..4 (the bad end last); the truth: 1 broken, 3 the first DIFFERENT
    truth = {0: StepVerdict.SAME, 1: StepVerdict.SKIP, 2: StepVerdict.SAME, 3: StepVerdict.DIFFERENT, 4: StepVerdict.DIFFERENT}
    commits = [c.commit for c in journal.candidates]

    class ByCommit(Scripted):
        def attempt(self, commit, level, number, good, repeat_of=None):
            return _attempt(truth[commits.index(commit)], number, level.limit)

    searcher = ByCommit(bisection, journal, [])
    answer = searcher.search()
    assert answer.kind == "found" and answer.first_different == commits[3]
    looked = [s.commit for s in searcher.journal.steps]
    assert looked == [commits[4], commits[1], commits[2], commits[3]], "the bad end, the middle (broken), its neighbour, the rest"
    # resumed from the journal on disk: nothing is run again
    _, again = prepare(BisectRequest(path, "HEAD~5", "HEAD", limit=10), _reporter())
    assert [s.commit for s in again.steps] == looked

    class NothingRuns(Scripted):
        def attempt(self, commit, level, number, good, repeat_of=None):
            raise AssertionError(f"ran {commit} again")

    assert NothingRuns(bisection, again, []).search() == answer


def test_a_skipped_build_just_before_the_first_different_one_leaves_the_answer_open(setup):
    repo, config, _ = setup
    bisection, journal = prepare(BisectRequest(config(confirm=False), "HEAD~5", "HEAD", limit=10), _reporter())
    bisection.root.mkdir(parents=True)
    truth = [StepVerdict.SAME, StepVerdict.SKIP, StepVerdict.DIFFERENT, StepVerdict.DIFFERENT, StepVerdict.DIFFERENT]
    commits = [c.commit for c in journal.candidates]

    class ByCommit(Scripted):
        def attempt(self, commit, level, number, good, repeat_of=None):
            return _attempt(truth[commits.index(commit)], number, level.limit)

    answer = ByCommit(bisection, journal, []).search()
    assert answer.kind == "ambiguous" and answer.could_be == commits[1:3] and "skipped" in answer.sentence


def test_the_command_line_refuses_in_one_sentence_and_keeps_the_jsonl_contract(setup):
    from fuzz_inputs import jsonl_problems
    from in_process import evalpipe

    repo, config, tmp = setup
    path = config()
    out = evalpipe("bisect", "-c", str(path), "--good", "nope", "--bad", "HEAD", cwd=tmp)
    assert out.returncode == 2 and "--good nope: no such commit" in out.stderr, out.stderr
    out = evalpipe("--progress", "jsonl", "bisect", "-c", str(path), "--good", "HEAD", "--bad", "HEAD", cwd=tmp)
    assert out.returncode == 2 and not jsonl_problems(out.stdout, out.returncode), out.stdout
    out = evalpipe("bisect", "-c", str(path), "--good", "", "--bad", "HEAD", cwd=tmp)
    assert out.returncode == 2 and "--good is empty" in out.stderr


def listed_config(tmp: Path) -> Path:
    builds = [{"name": f"w{i}", "description": f"wheel {i}", "env": {"EVALPIPE_LAYOUT_FAULT": "tree_reduce"} if i >= 2 else {}}
              for i in range(5)]
    path = tmp / "listed.yaml"
    path.write_text(yaml.safe_dump({"extends": str(shipped_dir("configs") / "default.yaml"), "output": str(tmp / "runs"),
                                    "bisect": {"builds": builds, "variant": "sp"}}))
    return path


@pytest.mark.parametrize(("good", "bad", "words"), [
    ("w9", "w4", "--good w9: no build of that name"),
    ("w0", "w0", "both name build w0"),
    ("w3", "w1", "comes after --bad w1"),
])
def test_a_listed_range_that_makes_no_sense_is_one_sentence(tmp_path, good, bad, words):
    with pytest.raises(UserError, match=words):
        prepare(BisectRequest(listed_config(tmp_path), good, bad), _reporter())


def test_listed_builds_are_candidates_in_order_each_its_env_over_the_variants(tmp_path):
    bisection, journal = prepare(BisectRequest(listed_config(tmp_path), "w0", "w4", limit=10), _reporter())
    assert [c.commit for c in journal.candidates] == ["w1", "w2", "w3", "w4"] and journal.repo is None
    variant = bisection.built("w3")
    assert variant.env["EVALPIPE_LAYOUT_FAULT"] == "tree_reduce" and variant.env["EVALPIPE_LAYOUT"] == "sp"
    assert bisection.root.name.startswith("w0-w4-")
    bisection.root.mkdir(parents=True)
    truth = {"w1": StepVerdict.SAME, "w2": StepVerdict.DIFFERENT, "w3": StepVerdict.DIFFERENT, "w4": StepVerdict.DIFFERENT}

    class ByName(Scripted):
        def attempt(self, commit, level, number, good, repeat_of=None):
            return _attempt(truth[commit], number, level.limit)

    answer = ByName(bisection, journal, []).search()
    assert answer.kind == "found" and answer.first_different == "w2" and "w2 \"wheel 2\"" in answer.sentence
