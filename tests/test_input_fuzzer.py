"""Property-based input fuzzer: every shipped config and realistic command lines, each with
one thing wrong (tests/support/fuzz_inputs.py makes them), run in-process, and the same rules for
every answer: exit 0 (accepted; `compare`'s verdicts 1 and 4 too) or 2 (refused); a
refusal is one sentence naming the key or option it is about, with no traceback; nothing
is created under the output root or the history location by a refused input, a dry run
or a read command; an accepted dry run plans every directory where the user put it.

Profiles (hypothesis settings, no example database, so nothing is written into the
checkout): `ci`, the default, derandomized (the same examples on every run, ~1 minute);
`deep`, EVALPIPE_FUZZ_PROFILE=deep, 25 times the examples from a fresh random seed each
run. EVALPIPE_FUZZ_COLLECT=FILE appends every failing example to FILE (JSON lines)
instead of failing at the first, to survey what is wrong (docs/development.md, Tests).

Each example runs in a directory of its own (cwd, HOME, the data directory, every output
root and history location inside it). What commands would ask a variant's interpreter
(vLLM's engine-argument names, the probed names: each real lookup imports vLLM, tens of
seconds) is answered from the names the shipped configs use (tests/config/test_engine_args.py and
tests/probing/test_names.py test the real lookups); no engine ever starts: `run` always
gets --dry-run, and a guard stops any command that reaches an engine start. `doctor` is
left out: it starts every variant's interpreter (seconds per call); its planning is
`run --dry-run`'s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
import typer
from fuzz_inputs import (
    BAD_ADDRESSES,
    BAD_NAMES,
    CONFIGS,
    GOOD_ADDRESSES,
    Block,
    Mutation,
    bad_values,
    changed,
    cluster_blocks,
    config_mutations,
    expect_blocks,
    gates_file,
    jsonl_problems,
    model_blocks,
    names_any,
    outside_bounds,
    record,
    refusal,
    requires_blocks,
    sampling_blocks,
    shipped_configs,
    shipped_engine_args,
    shipped_probe_names,
    shipped_text,
    snapshot,
    task_groups,
    with_block,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from in_process import evalpipe
from listeners import http_answer, listening, silent_answer

from evalpipe.config.gate_settings import Gates
from evalpipe.config.loading import load_config
from evalpipe.config.run_config import Localize
from evalpipe.data.scenarios import ScenarioSpec
from evalpipe.probing.names import ResolvedName

# ---------------------------------------------------------------------------
# Profiles and the collecting mode
# ---------------------------------------------------------------------------

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True, suppress_health_check=_QUIET)
settings.register_profile("deep", derandomize=False, database=None, deadline=None, print_blob=True, suppress_health_check=_QUIET)
PROFILE = os.environ.get("EVALPIPE_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "deep"):
    raise ValueError(f"EVALPIPE_FUZZ_PROFILE={PROFILE!r}: use ci (the default) or deep")
SCALE = 25 if PROFILE == "deep" else 1
COLLECT = os.environ.get("EVALPIPE_FUZZ_COLLECT")


def fuzzing(examples: int) -> settings:
    """The profile's settings with ``examples`` (the ci count) scaled to it."""
    return settings(settings.get_profile(PROFILE), max_examples=examples * SCALE)


# ---------------------------------------------------------------------------
# The world every example runs in
# ---------------------------------------------------------------------------

ENGINE_GUARD_EXIT = 97  # a command reached an engine start it must not reach here


@dataclass
class Example:
    base: Path  # everything of this example: snapshot root
    cwd: Path
    env: dict[str, str | None]
    hist_url: str


@dataclass
class World:
    root: Path
    cache: Path
    template: Path  # runs/, hist/ and gates.yaml, copied into every example that needs them
    plans: list[Any] = field(default_factory=list)  # what `run --dry-run` planned, newest last

    @contextlib.contextmanager
    def example(self, with_runs: bool = False) -> Iterator[Example]:
        base = Path(tempfile.mkdtemp(dir=self.root))
        cwd = base / "cwd"
        shutil.copytree(CONFIGS, cwd / "configs")
        if with_runs:
            for name in ("runs", "hist"):
                shutil.copytree(self.template / name, cwd / name)
            shutil.copy(self.template / "gates.yaml", cwd / "gates.yaml")
        (base / "home").mkdir()
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("EVALPIPE_")}
        env.update({"HOME": str(base / "home"), "EVALPIPE_CACHE": str(self.cache), "EVALPIPE_DATA_DIR": str(base / "data"),
                    "HF_HOME": str(base / "hf")})
        self.plans.clear()
        try:
            yield Example(base, cwd, env, f"sqlite:///{cwd / 'hist' / 'history.sqlite'}")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _fake_engine_args(known: set[str]):
    def known_engine_args(python: str, env: Any = None, timeout_s: float = 300, say: Any = None) -> dict[str, set[str]]:
        return {"offline": known, "serve": known}
    return known_engine_args


def _fake_resolve(known: dict[str, str]):
    def resolve(python: str, env: Any, names: list[str], *, say: Any = None, timeout_s: float = 300) -> dict[str, ResolvedName]:
        out = {}
        for name in names:
            if name in known:
                module, _, attr = name.rpartition(".")
                out[name] = ResolvedName(name, known[name], canonical=name, module=module, attr=attr)
            else:
                out[name] = ResolvedName(name, "function", error="cannot be imported: no such name (in the shipped configs)")
        return out
    return resolve


def _engine_guard(*args: Any, **kwargs: Any) -> None:
    typer.echo("fuzz guard: an engine would start here", err=True)
    raise typer.Exit(ENGINE_GUARD_EXIT)


def _localize_reached_its_engines(*args: Any, **kwargs: Any) -> None:
    typer.echo("fuzz: localize accepted its input (stopped before its first engine start)")
    raise typer.Exit(0)


def _night_reached_its_engines(*args: Any, **kwargs: Any) -> None:
    typer.echo("fuzz: nightly accepted its input (stopped before tonight's run)")
    raise typer.Exit(0)


def _write_template(root: Path) -> None:
    """runs/night-00 and night-01 (legacy, legacy-aa, sp; their artifacts recorded as a
    worker records them), their history, a gates file, and runs/loc: a DIVERGENT run with
    default.yaml as its config and what localize reads (teacher-forced scores, prompts)."""
    from fakes import record_artifacts
    from nightly_fakes import write_localizable_run, write_night

    from evalpipe.history.store import open_history
    from evalpipe.rundir.artifacts import RunDir

    runs = root / "runs"
    for i in range(2):
        write_night(runs, i)
    write_localizable_run(runs / "loc", load_config(CONFIGS / "default.yaml").model_dump(mode="json"))
    for name in ("night-00", "night-01"):
        for variant in ("legacy", "legacy-aa", "sp"):
            record_artifacts(RunDir(runs / name).variant(variant))
    hist = open_history(f"sqlite:///{root / 'hist' / 'history.sqlite'}", runs)
    for name in ("night-00", "night-01"):
        hist.record(runs / name)
    hist.engine.dispose()
    (root / "gates.yaml").write_text("scores: {margin: 0.02}\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("fuzz")
    template = root / "template"
    _write_template(template)
    w = World(root=root, cache=root / "cache", template=template)
    import evalpipe.commands.run as run_cmd

    real_make_plan = run_cmd.make_plan

    def make_plan(*args: Any, **kwargs: Any) -> Any:
        plan = real_make_plan(*args, **kwargs)
        w.plans.append(plan)
        return plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("evalpipe.config.engine_args.known_engine_args", _fake_engine_args(shipped_engine_args()))
        mp.setattr("evalpipe.probing.names.resolve", _fake_resolve(shipped_probe_names()))
        mp.setattr("evalpipe.commands.run.make_plan", make_plan)
        mp.setattr("evalpipe.commands.run.execute", _engine_guard)
        mp.setattr("evalpipe.pipeline.launching.run_variant", _engine_guard)
        mp.setattr("evalpipe.pipeline.localizing.ensure_model", _localize_reached_its_engines)
        mp.setattr("evalpipe.nightly.night.execute", _night_reached_its_engines)
        yield w


# ---------------------------------------------------------------------------
# The rules, applied to one answer
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """One input and what its answer must keep."""

    args: list[str]
    anchors: list[str]  # a refusal names one of these
    files: list[str] = field(default_factory=list)  # ... or one of these and a `key`
    must_refuse: str | None = None
    must_accept: bool = False  # good input: refusing it is as wrong as accepting a bad one
    accepted: tuple[int, ...] = (0,)
    writes_when_accepted: bool = False  # compare, export, data build: their output is the point
    output_root: Path | None = None  # run: where the user put the run directories
    described: str = ""


def judge(world: World, ex: Example, case: Case, test: str) -> None:
    before, root_before = snapshot(ex.base), set(os.listdir("/"))
    # a third of the inputs again under --progress jsonl, whose stdout is a contract: JSON lines ending in the verdict
    jsonl = zlib.crc32(repr(case.args).encode()) % 3 == 0
    proc = evalpipe(*(["--progress", "jsonl"] if jsonl else []), *case.args, cwd=ex.cwd, env=ex.env)
    after, root_after = snapshot(ex.base), set(os.listdir("/"))
    out = proc.stdout + proc.stderr
    problems = []
    if proc.returncode not in (*case.accepted, 2):
        problems.append(f"exit {proc.returncode}")
    if "Traceback" in out:
        problems.append("a traceback")
    if proc.returncode == 2:
        # under jsonl, what a terminal shows on stdout (a dry run's plan) is on stderr before the refusal
        said = _from_the_refusal(proc.stderr) if jsonl else proc.stderr
        sentence, who = refusal(said)
        if sentence is None:
            problems.append(f"not one sentence: {who}")
        # the parser's usage errors name their option or argument by construction
        elif who == "evalpipe" and not names_any(sentence, case.anchors, case.files):
            problems.append(f"the sentence names none of {case.anchors[:6]!r}")
    elif case.must_refuse and proc.returncode in case.accepted:
        problems.append(f"accepted although {case.must_refuse}")
    if case.must_accept and proc.returncode not in case.accepted:
        problems.append("refused although every part of it is good")
    new = changed(before, after)
    if new and (proc.returncode != 0 or not case.writes_when_accepted):
        problems.append(f"created or changed {new[:5]}")
    if root_after - root_before:
        problems.append(f"created {sorted(root_after - root_before)} at the file system's root")
    if jsonl:
        problems += [f"--progress jsonl: {p}" for p in jsonl_problems(proc.stdout, proc.returncode)]
    if proc.returncode == 0 and world.plans:
        problems += _plan_problems(world.plans[-1], case.output_root)
    if not problems:
        return
    first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "") or next(
        (ln for ln in proc.stdout.splitlines() if ln.strip()), "")
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "")
    report = {"test": test, "input": case.described, "args": case.args, "exit": proc.returncode, "problems": problems,
              "first_line": first[:400], "last_line": last[:400]}
    if COLLECT:
        record(COLLECT, report)
        return
    pytest.fail(f"{case.described}\nargs: {case.args}\nexit {proc.returncode}: " + "; ".join(problems)
                + f"\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}", pytrace=False)


def _from_the_refusal(stderr: str) -> str:
    lines = stderr.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.startswith(("error:", "Usage:"))), 0)
    return "\n".join(lines[first:])


def _plan_problems(plan: Any, output_root: Path | None) -> list[str]:
    """An accepted plan puts the run directory under the output root the user gave (a
    `~` expanded) and each variant's directory right inside the run directory."""
    problems = []
    if any(part.startswith("~") for part in plan.run_dir.parts):
        problems.append(f"run directory {plan.run_dir} has an unexpanded `~`")
    if output_root is not None and plan.run_dir.parent.resolve() != output_root.resolve():
        problems.append(f"run directory {plan.run_dir} is not under --output {output_root}")
    names = [v.name for v in plan.variants]
    if len(set(names)) != len(names):
        problems.append(f"variants planned twice: {names}")
    for name in names:
        if name in ("", ".", "..") or (plan.run_dir / name).parent != plan.run_dir:
            problems.append(f"variant {name!r} is not a directory name")
    return problems


# ---------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------


@given(mutation=config_mutations(), data=st.data())
@fuzzing(120)
def test_every_shipped_config_with_one_thing_wrong(world: World, mutation: Mutation, data: st.DataObject) -> None:
    selector = data.draw(st.sampled_from([*task_groups(mutation.config), "all"]), label="tasks")
    with world.example() as ex:
        (ex.cwd / "configs" / mutation.target).write_text(mutation.text, encoding="utf-8")
        args = ["run", selector, "-c", f"configs/{mutation.config}", "--dry-run"]
        output = data.draw(st.booleans(), label="--output")
        if output:
            args += ["--output", str(ex.base / "out")]
        files = [mutation.config, mutation.target, Path(mutation.config).name, Path(mutation.target).name]
        judge(world, ex, Case(args, mutation.anchors, files, mutation.must_refuse,
                              output_root=ex.base / "out" if output else None, described=mutation.describe()),
              "config")


# ---------------------------------------------------------------------------
# Blocks: `expect:` (top level and a variant's), `localize:`, --gates files
# ---------------------------------------------------------------------------


def _block_case(args: list[str], block: Block, files: list[str], described: str, anchors_extra: tuple[str, ...] | list[str] = (),
                **kw: Any) -> Case:
    return Case(args, [*block.anchors, *anchors_extra, "expect", "localize", "gates"], files, block.must_refuse, must_accept=block.must_accept,
                described=f"{described}: {block.describe()}", **kw)


@given(block=expect_blocks(), data=st.data())
@fuzzing(40)
def test_expect_blocks(world: World, block: Block, data: st.DataObject) -> None:
    config = data.draw(st.sampled_from(["default.yaml", "data_parallel.yaml", "numerics_bf16.yaml"]), label="config")
    variant = data.draw(st.sampled_from([None, *_variants_of(config)]), label="variant")
    where = ("expect",) if variant is None else ("variants", variant, "expect")
    if variant is None and isinstance(block.doc, dict):  # a top-level key every variant sets itself is never checked
        owns = [v.expect for v in load_config(CONFIGS / config).variants.values()]
        for key, value in block.doc.items():
            if not all(key in own for own in owns):
                continue
            if isinstance(value, dict) and all(isinstance(own[key], dict) for own in owns):
                inner = [k for k in value if all(k in own[key] for own in owns)]  # a mapping merges key by key
                if inner:
                    block.bad(f"top-level `expect.{key}.{inner[0]}` is replaced by every variant's own", key=key)
            else:
                block.bad(f"top-level `expect.{key}` is replaced by every variant's own", key=key)
    with world.example() as ex:
        (ex.cwd / "configs" / config).write_text(with_block(config, where, block), encoding="utf-8")
        args = ["run", task_groups(config)[0], "-c", f"configs/{config}", "--dry-run", "--output", str(ex.base / "out")]
        judge(world, ex, _block_case(args, block, [config], f"{config} {'.'.join(where)}", output_root=ex.base / "out",
                                     anchors_extra=[variant] if variant else []), "expect")


@given(block=model_blocks(Localize), word=st.sampled_from([None, None, None, "auto", "off", True, False, "on", "sometimes", ""]))
@fuzzing(25)
def test_localize_blocks(world: World, block: Block, word: str | bool | None) -> None:
    if word is not None:  # the one-word form (YAML's bare on/off are true/false)
        block = Block(word, [f"localize: {word!r}"], anchors=["localize", "when", "localize.when"])
        if word not in ("auto", "off", True, False):
            block.bad(f"`localize: {word!r}` is none of auto, off")
    with world.example() as ex:
        (ex.cwd / "configs" / "default.yaml").write_text(with_block("default.yaml", ("localize",), block), encoding="utf-8")
        args = ["run", "gsm8k", "-c", "configs/default.yaml", "--dry-run", "--output", str(ex.base / "out")]
        judge(world, ex, _block_case(args, block, ["default.yaml"], "default.yaml localize", output_root=ex.base / "out"), "localize-block")


@given(block=requires_blocks())
@fuzzing(20)
def test_requires_blocks(world: World, block: Block) -> None:
    import yaml

    doc = yaml.safe_load(shipped_text("scenarios.yaml"))
    doc["tasks"]["scenarios"][0]["requires"] = block.doc
    with world.example() as ex:
        (ex.cwd / "configs" / "scenarios.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        args = ["run", "scenarios", "-c", "configs/scenarios.yaml", "--dry-run", "--output", str(ex.base / "out")]
        judge(world, ex, _block_case(args, block, ["scenarios.yaml"], "scenarios.yaml task requires",
                                     output_root=ex.base / "out", anchors_extra=["tasks.scenarios.0.requires"]), "requires")


# sizes the plan holds against the engine (tests/pipeline/test_plan.py) are left out: a valid value may be refused there
@given(block=model_blocks(ScenarioSpec, skip=("chunk_offsets", "chunk_tokens", "window_tokens", "preempt_tokens", "preempt_requests")))
@fuzzing(20)
def test_scenario_blocks(world: World, block: Block) -> None:
    with world.example() as ex:
        (ex.cwd / "configs" / "scenarios.yaml").write_text(with_block("scenarios.yaml", ("scenarios",), block), encoding="utf-8")
        args = ["run", "scenarios", "-c", "configs/scenarios.yaml", "--dry-run", "--output", str(ex.base / "out")]
        judge(world, ex, _block_case(args, block, ["scenarios.yaml"], "scenarios.yaml scenarios",
                                     output_root=ex.base / "out", anchors_extra=["scenarios"]), "scenarios")


@given(block=model_blocks(Gates, threshold=True), wrapped=st.booleans(), output=st.booleans())
@fuzzing(30)
def test_gates_files(world: World, block: Block, wrapped: bool, output: bool) -> None:
    with world.example(with_runs=True) as ex:
        (ex.cwd / "fuzz-gates.yaml").write_text(gates_file(block, wrapped), encoding="utf-8")
        args = ["compare", "runs/night-00", "--gates", "fuzz-gates.yaml", *(["--output", "cmp-out"] if output else [])]
        judge(world, ex, _block_case(args, block, ["fuzz-gates.yaml"], f"--gates ({'under gates:' if wrapped else 'bare'})",
                                     accepted=(0, 1, 4), writes_when_accepted=True), "gates")


# ---------------------------------------------------------------------------
# Command lines
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One option with its value, or one positional (``param`` names it), or a fixed word."""

    words: tuple[str, ...]
    param: str = ""  # the positional's or the option's parameter, as usage errors name it
    aliases: tuple[str, ...] = ()
    pinned: bool = False  # the command's own words and --dry-run: never dropped or changed
    blank: tuple[str, ...] = ()  # values that name nothing: always a mistake


def opt(name: str, value: str | None = None, *, aliases: tuple[str, ...] = (), names: bool = False, listed: bool = False) -> Arg:
    """An option; ``names``: its value names a file, run, variant ...; ``listed``: a comma-separated list of them."""
    long = max((name, *aliases), key=len).lstrip("-")
    return Arg((name,) if value is None else (name, value), long, (name, *aliases, long),
               blank=_BLANK if listed else ("", " ") if names else ())


def pos(value: str, param: str, *shown: str) -> Arg:
    """A positional argument (each names a task, run, file ...); ``shown``: how the command's sentences call it (RUN_DIR ...)."""
    return Arg((value,), param, (param, param.upper(), *shown), blank=("", " "))


def word(*words: str) -> Arg:
    return Arg(tuple(words), pinned=True)


@functools.lru_cache(maxsize=None)
def _variants_of(config: str) -> tuple[str, ...]:
    try:
        return tuple(load_config(CONFIGS / config).variants)
    except Exception:  # noqa: BLE001 - a shipped config that does not load is test_config's failure
        return ("legacy",)


def _some(draw: st.DrawFn, args: list[Arg]) -> list[Arg]:
    return [a for a in args if draw(st.booleans())]


@st.composite
def run_command_lines(draw: st.DrawFn) -> list[Arg]:
    """`run TASKS --dry-run` with some of its options, consistent with the config it names (or the default one)."""
    config = draw(st.sampled_from(shipped_configs()))
    given = draw(st.booleans())
    config = config if given else "default.yaml"
    variants = draw(st.lists(st.sampled_from(_variants_of(config)), min_size=1, max_size=3, unique=True))
    return [word("run"), pos(draw(st.sampled_from(task_groups(config))), "tasks", "task"), word("--dry-run"),
            *([opt("-c", f"configs/{config}", aliases=("--config",), names=True)] if given else []),
            *_some(draw, [opt("--output", "OUT", names=True), opt("--limit", "3"), opt("--variants", ",".join(variants), names=True, listed=True),
                          opt("--run-id", "fz-1", names=True), opt("--timeout", "60"), opt("--stall-timeout", "30"),
                          opt(draw(st.sampled_from(["--noise-floor", "--no-noise-floor"])))])]


@st.composite
def compare_command_lines(draw: st.DrawFn) -> list[Arg]:
    if draw(st.booleans()):
        return [word("compare"), pos("runs/night-00", "targets", "RUN_DIR"),
                *_some(draw, [opt("--reference", "legacy", names=True), opt("--variants", "sp", names=True, listed=True),
                              opt("--output", "cmp-out", names=True), opt("--gates", "gates.yaml", names=True),
                              opt("--margin", "0.02")])]
    return [word("compare"), pos("runs/night-00/legacy", "targets", "RUN_A/VARIANT"), pos("runs/night-01/legacy", "targets", "RUN_B/VARIANT"),
            *_some(draw, [opt("--output", "cmp-out", names=True), opt("--gates", "gates.yaml", names=True), opt("--margin", "0.02")])]


@st.composite
def history_command_lines(draw: st.DrawFn) -> list[Arg]:
    where = draw(st.sampled_from([[opt("--history", "HIST", names=True)]] * 3 + [
        [opt("--output", "runs", names=True)], [opt("-c", "configs/default.yaml", aliases=("--config",), names=True)], []]))
    sub = draw(st.sampled_from(["list", "show", "export"]))
    own = {"list": _some(draw, [opt("--kind", "nightly", names=True), opt("-n", "5", aliases=("--last",))]),
           "show": [pos(draw(st.sampled_from(["night-00", "night-01"])), "run_id")],
           "export": [opt("-o", "exported.csv", aliases=("--out",), names=True), *_some(draw, [opt("--format", "csv", names=True)])]}[sub]
    return [word("history", sub), *own, *where]


@st.composite
def localize_and_data_command_lines(draw: st.DrawFn) -> list[Arg]:
    if draw(st.booleans()):
        return [word("data", "build"), *_some(draw, [pos("gsm8k_synth", "names")])]
    return [word("localize"), pos("runs/loc", "run_dir", "run directory"),
            *_some(draw, [opt("--variant", "sp", names=True, listed=True), opt("--samples", draw(st.sampled_from(["2", "64"]))),
                          opt("--positions", draw(st.sampled_from(["4", "256"]))), opt("--decode-steps", draw(st.sampled_from(["0", "64"]))),
                          opt("--timeout", "30")])]


@st.composite
def nightly_command_lines(draw: st.DrawFn) -> list[Arg]:
    """Tonight's run (it stops where the run would start) or judging a finished one (--from-run)."""
    config = [opt("-c", "configs/default.yaml", aliases=("--config",), names=True)]
    if draw(st.booleans()):
        return [word("nightly"), opt("--from-run", "runs/night-01", names=True), opt("--history", "HIST", names=True),
                *_some(draw, [*config, opt("--dashboard", "dash/index.html", names=True), opt("--component", "vllm=abc123")])]
    variants = draw(st.lists(st.sampled_from(_variants_of("default.yaml")), min_size=2, max_size=3, unique=True))
    return [word("nightly"), opt("--output", "OUT", names=True), opt("--history", "HIST", names=True),
            *_some(draw, [*config, opt("--limit", "3"), opt("--variants", ",".join(variants), names=True, listed=True),
                          opt("--run-id", "fz-night", names=True), opt("--timeout", "60"), opt("--stall-timeout", "30"),
                          opt("--component", "vllm_ascend=abc123"), opt("--dashboard", "dash/index.html", names=True)])]


@st.composite
def baseline_command_lines(draw: st.DrawFn) -> list[Arg]:
    return [word("baseline", "set"), pos(draw(st.sampled_from(["night-00", "night-01"])), "run_id"), opt("--history", "HIST", names=True),
            *_some(draw, [opt("--variant", draw(st.sampled_from(["legacy", "sp"])), names=True)])]


_BLANK = ("", " ", ",", ",,", " , ")
CLOSED_OPTIONS = {"--kind": {"run", "nightly"}, "--format": {"csv", "parquet"}}  # options whose values form a closed set


@dataclass
class ArgMutation:
    command: tuple[str, ...]  # the command's own words, as the line had them before the change
    args: list[Arg]
    kind: str
    must_refuse: str | None = None
    described: str = ""
    names: tuple[str, ...] = ()  # how the line's options and positionals are called, a dropped one's too

    def typed(self) -> list[str]:
        return [w for a in self.args for w in a.words]

    def anchors(self) -> list[str]:
        """What a refusal may name: any option or value typed (a dropped option leaves the
        others inconsistent: the sentence names what is left), a positional's parameter, or
        the one-letter option click reads out of a value that starts with `-`."""
        out = [*self.names, *(alias for a in self.args for alias in a.aliases)]
        for w in self.typed()[1:]:
            out += [f"`{w}`", f"'{w}'", repr(w), repr(w)[1:-1], w, *w.split("="), *([w[:2]] if w.startswith("-") and not w.startswith("--") else [])]
        return [a for a in out if a.strip()]


def _cli_values() -> st.SearchStrategy[str]:
    return st.one_of(bad_values().map(lambda v: v if isinstance(v, str) else "" if v is None else str(v)),
                     st.sampled_from([*_BLANK, "a,a", "legacy,legacy", "sp,sp,sp", "-1", "0", "1e999", "inf", "-inf", "nan",
                                      "--dry-run", "-c", *BAD_NAMES]),
                     st.sampled_from(["65", "257", "1000000", "1", "0.5", "1.0"]))  # around the bounds of the options with config keys


def _applies(kind: str, a: Arg) -> bool:
    option = a.words[0].startswith("-")
    return not a.pinned and {
        "drop": True,
        "value": len(a.words) == 2 or not option,
        "duplicate": True,
        "recase": option,
        "joined": len(a.words) == 2 and a.words[0].startswith("--"),
        "move": option,
    }[kind]


@st.composite
def mutated(draw: st.DrawFn, lines: st.SearchStrategy[list[Arg]]) -> ArgMutation:
    """A realistic command line with one thing wrong: an option dropped, given another value,
    given twice, re-cased, joined to its value, moved before the command, or a word added."""
    args = draw(lines)
    command = args[0].words
    kind = draw(st.sampled_from(["drop", "value", "duplicate", "recase", "joined", "move", "unknown"]))
    candidates = [i for i, a in enumerate(args) if kind != "unknown" and _applies(kind, a)]
    if not candidates:
        extra = draw(st.sampled_from(["--bogus", "-Z", "--Dry-Run", "stray", "--", "-", "--limit", "--output=", "--output"]))
        words = [w for a in args for w in a.words]
        at = draw(st.integers(min_value=1, max_value=len(words)))
        return ArgMutation(command, [Arg((*words[:at], extra, *words[at:]), pinned=True)], "unknown",
                           described=f"{extra!r} inserted at {at}", names=tuple(n for a in args for n in a.aliases))
    i = draw(st.sampled_from(candidates))
    a = args[i]
    out = list(args)
    must = None
    name = a.words[0] if a.words[0].startswith("-") else a.param
    if kind == "drop":
        del out[i]
        described = f"{' '.join(a.words)} dropped"
    elif kind in ("value", "duplicate") and (len(a.words) == 2 or not a.words[0].startswith("-")):
        value = draw(_cli_values())
        new = Arg((*a.words[:-1], value), a.param, a.aliases, blank=a.blank)
        if kind == "value":
            out[i] = new
        else:
            out.insert(i + 1, new)
        if value in a.blank:
            must = f"{name} is given {value!r}"
        must = must or outside_bounds(name, value)
        if name in CLOSED_OPTIONS and value not in CLOSED_OPTIONS[name]:
            must = f"{name} {value!r} is none of {', '.join(sorted(CLOSED_OPTIONS[name]))}"
        described = f"{name} -> {value!r}" + (" (given twice)" if kind == "duplicate" else "")
    elif kind == "duplicate":  # a flag, given twice
        out.insert(i + 1, a)
        described = f"{name} twice"
    elif kind == "recase":
        recased = name[:2] + name[2:].upper() if name.startswith("--") else name.swapcase()
        out[i] = Arg((recased, *a.words[1:]), a.param, (*a.aliases, recased))
        described = f"{name} -> {recased}"
    elif kind == "joined":
        out[i] = Arg((f"{name}={a.words[1]}",), a.param, a.aliases)
        described = f"{name}={a.words[1]}"
    else:  # move
        out.pop(i)
        out.insert(0, a)
        described = f"{' '.join(a.words)} before the command"
    return ArgMutation(command, out, kind, must, described, a.aliases)


def _command_case(ex: Example, m: ArgMutation, *, accepted: tuple[int, ...] = (0,), writes: bool = False,
                  output_root: Path | None = None) -> Case:
    repl = {"OUT": str(ex.base / "out"), "HIST": ex.hist_url}
    args = [repl.get(w, w) for w in m.typed()]
    return Case(args, m.anchors(), must_refuse=m.must_refuse, accepted=accepted, writes_when_accepted=writes,
                output_root=output_root, described=f"{m.kind}: {m.described}")


@given(m=mutated(run_command_lines()))
@fuzzing(60)
def test_run_dry_run_command_lines(world: World, m: ArgMutation) -> None:
    with world.example() as ex:
        judge(world, ex, _command_case(ex, m, output_root=_output_root(ex, m)), "run")


def _output_root(ex: Example, m: ArgMutation) -> Path | None:
    """Where the user put the run directories: the last --output, `~` expanded, relative to the cwd."""
    words = [{"OUT": str(ex.base / "out")}.get(w, w) for w in m.typed()]
    given = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--output"]
    given += [w.removeprefix("--output=") for w in words if w.startswith("--output=")]
    if not given or not given[-1].strip():
        return None
    value = given[-1]
    if value == "~" or value.startswith("~/"):
        value = str(ex.base / "home") + value[1:]
    return ex.cwd / value


@given(m=mutated(compare_command_lines()), tamper=st.sampled_from(
    [None, None, None, "night-00/sp/manifest.json", "night-00/run.json", "night-00/sp/samples.parquet:truncate",
     "night-00/sp:delete", "night-00/legacy/manifest.json:garbage"]))
@fuzzing(40)
def test_compare_command_lines(world: World, m: ArgMutation, tamper: str | None) -> None:
    with world.example(with_runs=True) as ex:
        if tamper is not None:
            _tamper(ex.cwd / "runs", tamper)
        case = _command_case(ex, m, accepted=(0, 1, 4), writes=True)
        if tamper is not None:
            case.anchors += [*Path(tamper.split(":")[0]).parts, tamper.split(":")[0]]
            case.described += f"; {tamper}"
        judge(world, ex, case, "compare")


def _tamper(runs: Path, how: str) -> None:
    name, _, what = how.partition(":")
    path = runs / name
    if what == "delete":
        shutil.rmtree(path)
    elif what == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif what == "garbage":
        path.write_text("{not json")
    else:
        path.unlink()


@given(m=mutated(history_command_lines()))
@fuzzing(50)
def test_history_read_command_lines(world: World, m: ArgMutation) -> None:
    with world.example(with_runs=True) as ex:
        export = m.command == ("history", "export")
        case = _command_case(ex, m, writes=export)
        # with the option that named the history dropped, the default location has none:
        # the sentence names the options that would name one
        case.anchors += ["--history", "--output"]
        judge(world, ex, case, "history")


@given(m=mutated(localize_and_data_command_lines()))
@fuzzing(40)
def test_localize_and_data_build_command_lines(world: World, m: ArgMutation) -> None:
    with world.example(with_runs=True) as ex:
        data = m.command == ("data", "build")
        judge(world, ex, _command_case(ex, m, writes=data), "localize/data")


@given(m=mutated(nightly_command_lines()))
@fuzzing(30)
def test_nightly_command_lines(world: World, m: ArgMutation) -> None:
    with world.example(with_runs=True) as ex:
        case = _command_case(ex, m, accepted=(0, 1, 4), writes=True)
        case.anchors += ["--history", "--output", "--from-run"]
        judge(world, ex, case, "nightly")


@given(m=mutated(baseline_command_lines()))
@fuzzing(20)
def test_baseline_command_lines(world: World, m: ArgMutation) -> None:
    with world.example(with_runs=True) as ex:
        case = _command_case(ex, m, writes=True)
        case.anchors += ["--history", "--output"]
        judge(world, ex, case, "baseline")


# ---------------------------------------------------------------------------
# The cluster and sampling surfaces
# ---------------------------------------------------------------------------


@given(block=cluster_blocks())
@fuzzing(20)
def test_cluster_blocks(world: World, block: Block) -> None:
    with world.example() as ex:
        (ex.cwd / "configs" / "default.yaml").write_text(with_block("default.yaml", ("cluster",), block), encoding="utf-8")
        args = ["run", "gsm8k", "-c", "configs/default.yaml", "--dry-run", "--output", str(ex.base / "out")]
        judge(world, ex, _block_case(args, block, ["default.yaml"], "default.yaml cluster", output_root=ex.base / "out"), "cluster")


@given(block=sampling_blocks(), on_task=st.booleans(), null=st.integers(0, 6))
@fuzzing(20)
def test_sampling_blocks(world: World, block: Block, on_task: bool, null: int) -> None:
    import yaml

    doc = yaml.safe_load(with_block("default.yaml", ("sampling",), block))
    if on_task:  # the same block as the first gsm8k task's own
        doc["tasks"]["gsm8k"][0]["sampling"] = doc.pop("sampling")
        if null == 0:  # read as "greedy here", it would take the run's: refused
            doc["tasks"]["gsm8k"][0]["sampling"] = None
            block = Block(None, ["tasks.gsm8k.0.sampling: None"], anchors=["sampling", "tasks.gsm8k.0.sampling"])
            block.bad("a task's `sampling: null`")
    with world.example() as ex:
        (ex.cwd / "configs" / "default.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        args = ["run", "gsm8k", "-c", "configs/default.yaml", "--dry-run", "--output", str(ex.base / "out")]
        judge(world, ex, _block_case(args, block, ["default.yaml"], f"default.yaml {'task' if on_task else 'run'} sampling",
                                     output_root=ex.base / "out"), "sampling")


CONFIG_CLUSTERS = [None, {"address": "auto"}, {"address": "auto", "distinct_nodes": True}, {"address": "auto", "concurrency": 2}]


@given(address=st.sampled_from([None, "off", *GOOD_ADDRESSES, *BAD_ADDRESSES]), concurrency=st.sampled_from([None, "1", "3", "0", "-1", "x"]),
       spread=st.sampled_from([None, "--distinct-nodes", "--any-nodes"]), configured=st.sampled_from(CONFIG_CLUSTERS))
@fuzzing(30)
def test_cluster_options_over_the_config(world: World, address: str | None, concurrency: str | None, spread: str | None,
                                         configured: dict | None) -> None:
    """--cluster, --concurrency and --distinct-nodes/--any-nodes over a config's `cluster:`:
    an oracle of the rules (a bad address; an option for a cluster on a run here; a bad
    count; an option that would drop a setting it cannot coexist with)."""
    why = None
    if address is not None and address in BAD_ADDRESSES:
        why = f"--cluster {address!r} {BAD_ADDRESSES[address]}"
    on_cluster = address not in (None, "off") or (address is None and configured is not None)
    conf = configured or {}
    if why is None and (concurrency is not None or spread is not None) and not on_cluster:
        why = "--concurrency/--distinct-nodes on a run here"
    elif why is None and concurrency in ("0", "-1", "x"):
        why = f"--concurrency {concurrency}"
    elif why is None and concurrency is not None and spread == "--distinct-nodes":
        why = "--concurrency with --distinct-nodes"
    elif why is None and concurrency is not None and spread is None and conf.get("distinct_nodes"):
        why = "--concurrency over the config's distinct_nodes"
    elif why is None and spread == "--distinct-nodes" and concurrency is None and conf.get("concurrency"):
        why = "--distinct-nodes over the config's concurrency"
    with world.example() as ex:
        doc = parsed_default()
        if configured is not None:
            doc["cluster"] = configured
        (ex.cwd / "configs" / "default.yaml").write_text(_dump_yaml(doc), encoding="utf-8")
        args = ["run", "gsm8k", "-c", "configs/default.yaml", "--dry-run", "--output", str(ex.base / "out"),
                *(["--cluster", address] if address is not None else []),
                *(["--concurrency", concurrency] if concurrency is not None else []), *([spread] if spread else [])]
        case = Case(args, ["--cluster", "--concurrency", "--distinct-nodes", "--any-nodes", "cluster.concurrency",
                           "cluster.distinct_nodes"], must_refuse=why, must_accept=why is None, output_root=ex.base / "out",
                    described=f"cluster options {args[7:]} over {configured}")
        judge(world, ex, case, "cluster-options")


def parsed_default() -> dict:
    import yaml

    return yaml.safe_load((CONFIGS / "default.yaml").read_text(encoding="utf-8"))


def _dump_yaml(doc: Any) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


GOOD_NODES = ["CPU=1", "CPU=2,node_a=1", "NPU=0.5", "CPU=0,NPU=8", " CPU = 1 , x=2 "]
BAD_NODES = ["CPU", "CPU=", "=1", "CPU=x", "CPU=-1", "CPU=0", "CPU=0,a=0", "CPU=1.5", "CPU=1,CPU=2", "CPU=nan", "CPU=inf", "",
             ",", "CPU=1,", "名前=1,CPU=1e999"]


@given(nodes=st.lists(st.sampled_from([*GOOD_NODES, *BAD_NODES]), min_size=1, max_size=3),
       place=st.sampled_from(["new", "existing", "file", ""]), verb=st.sampled_from(["up", "up", "down"]))
@fuzzing(40)
def test_the_local_cluster_command_line(tmp_path_factory: pytest.TempPathFactory, nodes: list[str], place: str, verb: str) -> None:
    """`python -m evalpipe.cluster.local`: a bad node or --dir is one sentence of the option
    parser before anything starts (no traceback, nothing made); good ones reach the start."""
    import contextlib
    import io

    from evalpipe.cluster import local

    root = tmp_path_factory.mktemp("local")
    where = {"new": root / "c", "existing": root, "file": root / "f", "": Path("")}[place]
    (root / "f").write_text("")
    started: list[Any] = []
    argv = [verb, *(a for n in nodes for a in ("--node", n) if verb == "up"), "--dir", str(where) if place else ""]
    bad = [n for n in nodes if n in BAD_NODES] if verb == "up" else []
    must_refuse = bool(bad) or place in ("file", "")
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        mp.setattr(local, "start", lambda specs, root_dir: started.append(specs) or local.LocalCluster(root_dir, "127.0.0.1:1", specs))
        mp.setattr(local, "marked_pids", lambda root_dir: [])
        try:
            code = local.main(argv)
        except SystemExit as exit_:
            code = exit_.code
    text = err.getvalue()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert "Traceback" not in text, text
    if must_refuse:
        assert code == 2 and not started, (argv, code, text)
        assert len([ln for ln in lines if ": error: " in ln]) == 1 and lines[0].startswith("usage:"), text
        assert not (root / "c").exists(), "a refused command made its directory"
    else:
        assert code == 0, (argv, code, text)
        if verb == "up":
            (specs,) = started
            assert len(specs) == len(nodes) and all(float(s.get("CPU", 1)).is_integer() for s in specs), specs


LISTENER_ANSWERS = {"http": http_answer, "silent": silent_answer, "nothing": None}
LISTENERS = {"http": "an HTTP server answers on", "silent": "accepts connections but says nothing in 1 s", "nothing": "nothing answers on"}


@given(address=st.sampled_from([*BAD_ADDRESSES, *LISTENERS]), scheme=st.sampled_from(["", "ray://"]))
@fuzzing(30)
def test_a_cluster_address_fails_at_once_saying_what_is_wrong(address: str, scheme: str) -> None:
    """What doctor --cluster and a run on a cluster do first: a malformed address is refused
    saying what is wrong with it; where no Ray listens (nothing, an HTTP server, a server that
    says nothing), the sentence says what listens there."""
    from evalpipe.cluster import session
    from evalpipe.commands.run import with_cluster
    from evalpipe.config.loading import parse_config
    from evalpipe.errors import UserError

    config = parse_config(parsed_default())
    if address in BAD_ADDRESSES:
        with pytest.raises(UserError) as refused:
            with_cluster(config, address)
        assert BAD_ADDRESSES[address] in str(refused.value), refused.value
        return
    fake_ray = type("Ray", (), {"is_initialized": staticmethod(lambda: False)})
    with listening(LISTENER_ANSWERS[address]) as port, pytest.MonkeyPatch.context() as mp:
        mp.setattr(session, "import_ray", lambda: fake_ray)
        mp.setattr(session, "REACH_TIMEOUT_S", 1.0)  # what "says nothing" means here
        given = f"{scheme}127.0.0.1:{port}"
        with pytest.raises(session.ClusterUnavailable) as failed:
            session.connect(with_cluster(config, given).cluster.address or "")
    assert LISTENERS[address] in str(failed.value) and "Traceback" not in str(failed.value), failed.value


# ---------------------------------------------------------------------------
# The fuzzer's own parts
# ---------------------------------------------------------------------------


def test_the_mutations_reach_every_shipped_config_and_every_extends_chain():
    from fuzz_inputs import duplicate_keys, duplicated_key_texts, extends_chain

    names = shipped_configs()
    assert "default.yaml" in names and any(n.startswith("ascend/") for n in names), names
    assert extends_chain("numerics_bf16_noisy.yaml") == ["numerics_bf16_noisy.yaml", "numerics_bf16.yaml", "default.yaml"]
    for name in names:
        text = (CONFIGS / name).read_text(encoding="utf-8")
        assert duplicate_keys(text) == [], name
        dups = duplicated_key_texts(text)
        assert len(dups) >= 5, name
        written_twice = [key for key, dup in dups if duplicate_keys(dup) == [key]]
        assert len(written_twice) >= 0.9 * len(dups), (name, [k for k, d in dups if duplicate_keys(d) != [k]])


def test_the_one_sentence_rule():
    assert refusal("error: config x.yaml: unknown key `Model`; remove it.\n") == ("config x.yaml: unknown key `Model`; remove it.", "evalpipe")
    assert refusal("Usage: root run [OPTIONS] TASKS\nTry 'root run --help' for help.\n╭─ Error ──╮\n│ No such option: --bogus │\n╰──╯\n") \
        == ("No such option: --bogus", "usage")
    assert refusal("error: one\nerror: two\n")[0] is None
    assert refusal("Traceback (most recent call last):\n  ...\nKeyError: 'x'\n")[0] is None
    assert refusal("warning: something\nerror: the sentence\n")[0] is None
    assert names_any("variant `team/sp` cannot name a directory", ["variants", "team/sp"])
    assert not names_any("unknown key `model`", ["engine"])
    assert names_any("cfg.yaml: `x` is bad", ["nope"], files=["cfg.yaml"])


def test_the_interpreter_lookups_are_answered_from_the_shipped_names():
    known = shipped_probe_names()
    assert known["evalpipe.lab.layout.model.LayoutForCausalLM"] == "class"
    assert known["evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention"] == "function"
    assert not any(n.startswith("vllm_ascend.") for n in known), "names this interpreter cannot import stay unknown, as for real"
    assert {"max_model_len", "hf_overrides", "data_parallel_size"} <= shipped_engine_args()


def test_the_block_oracle_and_the_option_bounds():
    from fuzz_inputs import KNOWN_GAPS

    good = Block({"samples": 2})
    assert good.must_accept and good.must_refuse is None
    bad = Block({})
    bad.bad("`samples: 0` is outside its bounds")
    assert not bad.must_accept and bad.must_refuse == "`samples: 0` is outside its bounds"
    for gap in KNOWN_GAPS:  # a known gap is asserted neither way ...
        pending = Block({})
        pending.bad("why", gap, key="per_forward")
        assert pending.must_refuse is None and not pending.must_accept and gap in pending.gaps
    unknown = Block({})
    unknown.bad("why", "a rule now in place")  # ... a gap no longer listed is a must-refuse
    assert unknown.must_refuse == "why"
    assert outside_bounds("--positions", "1000000") and outside_bounds("--samples", "0") and outside_bounds("--margin", "nan")
    assert not outside_bounds("--positions", "256") and not outside_bounds("--decode-steps", "0") and not outside_bounds("--limit", "x")
