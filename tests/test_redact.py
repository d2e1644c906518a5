"""Credentials never reach what evalpipe writes: run.json, manifests, reports, the
history database, nightly files, the dashboard, the worker's log and messages.

The end-to-end test sets every kind of credential a config or an environment holds
(HF_TOKEN and its like, *_API_KEY / *_SECRET / *PASSWORD variables, the variable
``launch.api_key_env`` names, an engine argument, a proxy URL, endpoint URLs and a
history URL with passwords, a server command with --api-key), builds a run directory
without an engine (the plan's run.json, fake traces, the real worker up to its engine
start against a closed port, the real comparison, reports, history and nightly files)
and reads the bytes of every file for the secrets. job.json, the worker's input, is
the one file that keeps the endpoint's real URL.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import make_samples, mutate, set_token, write_run
from rich.console import Console

from evalpipe.config.loading import parse_config
from evalpipe.documents.manifest import VariantManifest, write_manifest
from evalpipe.documents.run_doc import RunModel
from evalpipe.documents.worker_job import JOB_JSON, ServerJob, WorkerJob, write_job
from evalpipe.pipeline.plan import make_plan, run_info
from evalpipe.redact import REDACTED, is_secret_name, redact, redact_env, redact_text
from evalpipe.reporting import TerminalReporter
from evalpipe.rundir import artifacts

MARK = "S3CRET"  # every secret below holds it, so one search finds any of them
ENV_SECRETS = {
    "HF_TOKEN": f"hf_{MARK}_env",
    "HUGGING_FACE_HUB_TOKEN": f"hub_{MARK}_env",
    "WANDB_API_KEY": f"wandb_{MARK}",
    "MY_SERVICE_SECRET": f"svc_{MARK}",
    "PGPASSWORD": f"pg_{MARK}",
    "EP_CREDS": f"epkey_{MARK}",  # no credential-looking name: launch.api_key_env names it
    "HTTPS_PROXY": f"http://proxyuser:proxy_{MARK}@proxy.example:3128",
}
URL_PASSWORD = f"urlpw_{MARK}"
HISTORY_URL = f"postgresql+psycopg://evalpipe:db_{MARK}@db.example/history"

CONFIG = {
    "model": {"path": "builtin:tiny-gsm", "dtype": "float32"},
    "engine": {"max_model_len": 4096, "hf_token": f"engine_{MARK}"},
    "env": {"HF_TOKEN": f"hf_{MARK}_config", "HUGGING_FACE_HUB_TOKEN": f"hub_{MARK}_config"},
    "launch": {"mode": "endpoint", "api_key_env": "EP_CREDS", "ready_timeout_s": 0.5},
    "variants": {
        "legacy": {"env": {"DB_PASSWORD": f"dbpw_{MARK}"}, "launch": {"url": f"http://alice:{URL_PASSWORD}@127.0.0.1:9/v1"}},
        "sp": {"env": {"EP_CREDS": f"epkey_{MARK}_config", "LAYOUT": "sp"},
               "launch": {"url": f"http://bob:{URL_PASSWORD}@127.0.0.1:9/v1?api_key=q_{MARK}"}},
        "tp": {"launch": {"mode": "serve", "command": ["vllm", "serve", "--api-key", f"cmd_{MARK}", f"--hf-token=flag_{MARK}"]}},
    },
    "reference": "legacy",
    "noise_floor": False,
    "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]},
    "nightly": {"history": HISTORY_URL},
}


# ---------------------------------------------------------------------------
# the rules
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "MY_API_KEY", "apiKey",
                                  "api-key", "AWS_SECRET_ACCESS_KEY", "X_SECRET", "DB_PASSWORD", "PGPASSWORD",
                                  "DB_PASS", "hf_token", "accessToken", "OAUTH_CLIENT", "X-Amz-Signature"])
def test_credential_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "tokenizer", "tokenizer_mode", "max_tokens",
                                  "max_num_batched_tokens", "tokens_per_s", "PATH", "PWD", "VLLM_CPU_KVCACHE_SPACE",
                                  "bypass_cache", "AUTHOR", "passkey", "teacher_kl_max", "n_tokens", "design"])
def test_names_that_are_not_credentials(name):
    assert not is_secret_name(name)


def test_text_rules():
    assert redact_text("http://user:pw@host:8000/v1") == "http://user:***@host:8000/v1"
    # SQLAlchemy takes an unencoded / or @ in the password: so does the rule
    assert redact_text("postgresql+psycopg://u:p/w@x@db/h") == "postgresql+psycopg://u:***@db/h"
    assert redact_text("postgresql://u@db/h") == "postgresql://u@db/h"  # a user alone is no secret
    assert redact_text("sqlite:////tmp/h.sqlite") == "sqlite:////tmp/h.sqlite"
    assert redact_text("GET http://h/x?a=1&token=t0k&sig=s#f failed") == "GET http://h/x?a=1&token=***&sig=***#f failed"
    assert redact_text("$ env HF_TOKEN=hf_x vllm serve --api-key sk-1 --port 8000 --hf-token=hf_y") == \
        "$ env HF_TOKEN=*** vllm serve --api-key *** --port 8000 --hf-token=***"
    assert redact_text("max_tokens=5 --max-model-len 4096 -1.5") == "max_tokens=5 --max-model-len 4096 -1.5"
    assert redact_text(3) == 3 and redact_text(None) is None


def test_structures():
    got = redact({"env": {"HF_TOKEN": "a", "KEYVAR": "b", "OK": "http://u:p@h"}, "api_key_env": "KEYVAR",
                  "hf_token": None, "command": ["x", "--api-key", "k", "--token=t", "--port", "1"], "n": 3}, also=["KEYVAR"])
    assert got == {"env": {"HF_TOKEN": REDACTED, "KEYVAR": REDACTED, "OK": "http://u:***@h"}, "api_key_env": "KEYVAR",
                   "hf_token": None, "command": ["x", "--api-key", REDACTED, "--token=***", "--port", "1"], "n": 3}
    assert redact(got, ["KEYVAR"]) == got  # idempotent
    assert list(redact_env({"B": "1", "A_TOKEN": "x"})) == ["A_TOKEN", "B"]
    # what a manifest records about its files stays as it is
    record = {"artifacts": {"tokens.parquet": {"size": 1, "sha256": "ab", "rows": 2}, "teacher_baseline.parquet": {}}}
    assert redact(record) == record


def test_shipped_configs_lose_nothing_to_redaction(tmp_path):
    """No setting of the shipped configs looks like a credential: their run.json is unchanged."""
    from evalpipe.config.loading import load_config

    for path in sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml")):
        plan = make_plan(load_config(path), str(path), "all", strict=False, output=str(tmp_path))
        assert REDACTED not in run_info(plan).model_dump_json(), path


# ---------------------------------------------------------------------------
# every output of a run
# ---------------------------------------------------------------------------


def _worker_until_engine_start(plan, vdir: Path) -> str:
    """The real worker of an endpoint variant against a closed port: it writes its manifest
    and fails at the engine start (no engine needed); returns what it printed as events."""
    from evalpipe.pipeline.jobs import worker_job

    job = worker_job(plan, "sp", RunModel(path=str(vdir / "no-model")), vdir)
    job = job.model_copy(update={"tasks": []})  # lm-eval is not needed to get to the engine start
    job_path = vdir / JOB_JSON
    write_job(job_path, job)
    with open(vdir / artifacts.WORKER_LOG, "ab") as log:
        proc = subprocess.run([sys.executable, "-m", "evalpipe.worker.main", str(job_path)], stdout=subprocess.PIPE,
                              stderr=log, env=plan.variant("sp").process_env(), timeout=120, check=False)
    assert proc.returncode != 0
    return proc.stdout.decode()


def _files_with_secrets(root: Path) -> dict[str, list[str]]:
    found = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if MARK.encode() in data:
            text = data.decode("utf-8", "replace")
            found[str(path.relative_to(root))] = sorted({text[max(0, i - 30):i + 20] for i in _all(text, MARK)})[:3]
    return found


def _all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def test_no_credential_reaches_any_output(tmp_path, monkeypatch):
    from evalpipe.commands import run as run_command
    from evalpipe.execution import serve
    from evalpipe.history.store import History, open_history
    from evalpipe.nightly import dashboard_data, judging
    from evalpipe.nightly import night as nightly
    from evalpipe.pipeline.comparing import report_run
    from evalpipe.report.dashboard import render_dashboard

    for k, v in ENV_SECRETS.items():
        monkeypatch.setenv(k, v)
    config = parse_config(CONFIG)
    plan = make_plan(config, "cfg.yaml", "gsm8k", variants="legacy,sp", output=str(tmp_path / "runs"), run_id="night-1")
    run_dir = plan.run_dir

    # run.json from the plan, traces without an engine
    legacy = make_samples(6)
    write_run(run_dir, {"legacy": legacy, "sp": mutate(legacy, 2, set_token(3, 7))}, run_info=run_info(plan))
    # the worker's manifest, messages and log, as far as they go without a server
    events = _worker_until_engine_start(plan, run_dir / "sp")
    assert "http://bob:***@127.0.0.1:9/v1" in events
    # compare.json, report.md / .html, junit.xml, run.json again (the verdict)
    console = Console(file=io.StringIO(), width=200)
    report_run(run_dir, TerminalReporter(console))
    info = artifacts.read_json(run_dir / "run.json")
    assert info["config"]["launch"]["api_key_env"] == "EP_CREDS"  # the name stays, its value never appears
    assert info["variant_settings"]["legacy"]["launch"]["url"] == "http://alice:***@127.0.0.1:9/v1"
    # the history (SQLite here; its URL, shown in the dashboard, is the config's PostgreSQL one)
    hist = open_history(f"sqlite:///{tmp_path / 'history.sqlite'}", tmp_path)
    hist.record(run_dir, kind="nightly", labels={"vllm": "0.1", "repo": f"https://ci:tok_{MARK}@git.example/r.git"})
    shown = History(hist.engine, HISTORY_URL)
    assert shown.where == "postgresql+psycopg://evalpipe:***@db.example/history"
    judgement = judging.judge(shown, "night-1")
    nightly.write_night(run_dir, judgement, dashboard=run_dir / "dashboard.html")
    artifacts.write_text(run_dir / "dashboard.html",
                         render_dashboard(dashboard_data.dashboard_data(shown, None, "nightly", run_dir / "dashboard.html")))
    # a server's log starts with its command line (evalpipe writes it)
    server = serve.ServerProcess(command=["/nonexistent/vllm", "serve", "--api-key", f"cmd_{MARK}"], url="http://127.0.0.1:9",
                                 log_path=run_dir / "tp-engine.log", grace_s=1)
    with pytest.raises(OSError):
        server.start(plan.variant("sp").process_env())
    # what --dry-run prints (a CI log keeps it)
    dry_run = Console(file=io.StringIO(), width=400)
    run_command._print_plan(make_plan(config, "cfg.yaml", "gsm8k", output=str(tmp_path / "runs"), strict=False), TerminalReporter(dry_run))

    outputs = {"run.json", "compare.json", "report.md", "report.html", "junit.xml", "nightly.json", "nightly.md",
               "nightly-junit.xml", "dashboard.html", "sp/manifest.json", "sp/worker.log", "tp-engine.log"}
    assert outputs <= {str(p.relative_to(run_dir)) for p in run_dir.rglob("*")}
    leaks = _files_with_secrets(run_dir)
    # job.json is the worker's input, not a record: it keeps what the worker needs, the endpoint's
    # real URL and the engine arguments; the environment's secrets reach the worker by environment
    assert set(leaks) == {"sp/job.json"}, leaks
    job = (run_dir / "sp/job.json").read_text()
    assert len(_all(job, MARK)) == 3 and job.count(f"http://bob:{URL_PASSWORD}@") == 1 and f"engine_{MARK}" in job
    assert MARK.encode() not in (tmp_path / "history.sqlite").read_bytes()
    for text in (events, console.file.getvalue(), dry_run.file.getvalue()):
        assert MARK not in text
    assert "http://alice:***@127.0.0.1:9/v1" in dry_run.file.getvalue()
    # what redaction leaves: the reports still tell the variants apart
    assert "env.LAYOUT=sp" in (run_dir / "report.md").read_text()


def test_history_redacts_a_run_json_written_before_redaction(tmp_path):
    """Run directories from older evalpipe versions hold unredacted settings; importing
    one into the history (and reporting on it) must not copy them."""
    from evalpipe.config.gate_settings import Gates
    from evalpipe.documents.comparison import ComparisonDocument
    from evalpipe.documents.run_doc import read_run_document
    from evalpipe.history.store import open_history
    from evalpipe.report import render_markdown

    info = {"variant_settings": {"legacy": {"env": {"HF_TOKEN": f"hf_{MARK}"}, "launch": {"url": f"http://a:{MARK}@h/v1"}},
                                 "sp": {"env": {"HF_TOKEN": f"hf_{MARK}"}}}}
    run = write_run(tmp_path / "old-run", {"legacy": make_samples(3), "sp": make_samples(3)}, run_info=info)
    hist = open_history(f"sqlite:///{tmp_path / 'h.sqlite'}", tmp_path)
    hist.record(run)
    assert MARK.encode() not in (tmp_path / "h.sqlite").read_bytes()
    empty = ComparisonDocument(run_id="old-run", reference="legacy", variants=["sp"], status="IDENTICAL", gates=Gates(),
                               noise_floor=None, comparisons=[])
    md = render_markdown(empty, read_run_document(run))
    assert MARK not in md and "http://a:\\*\\*\\*@h/v1" in md


def test_the_files_that_keep_credentials_are_the_owners_alone(tmp_path):
    """job.json (the endpoint's real URL, engine args as given) and server-args.yaml (an
    --api-key among them) are 0600 whatever the umask, also over an older 0644 file;
    every other output keeps the umask's mode."""
    import os
    import stat

    from evalpipe.config.run_config import Launch
    from evalpipe.execution import serve
    from evalpipe.execution.launch import run_worker
    from evalpipe.pipeline.plan import PlannedVariant

    python = tmp_path / "fake-python"  # stands in for the worker: nothing to run, only job.json to write
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    variant = PlannedVariant(name="v", description="", python=str(python), env_overrides={}, engine_args={}, run_id="mode-unit")
    vdir = tmp_path / "v"
    vdir.mkdir()
    (vdir / "job.json").write_text("{}")  # a resumed variant's, from before
    old = os.umask(0o022)
    try:
        (vdir / "job.json").chmod(0o644)
        job = WorkerJob(variant="v", output_dir=str(vdir), engine_args={}, tasks=[], topk=1, data_dir=str(tmp_path),
                        server=ServerJob(url=f"http://bob:{URL_PASSWORD}@127.0.0.1:9/v1"))
        run_worker(variant, job, vdir, lambda e: None)
        serve.write_server_args(vdir / serve.SERVER_ARGS_FILE,
                                serve.server_args({"api_key": f"k_{MARK}"}, Launch(mode="serve"), 8123))
        write_manifest(vdir / "manifest.json", VariantManifest(variant="v", status="running"))
    finally:
        os.umask(old)
    mode = {name: stat.S_IMODE((vdir / name).stat().st_mode) for name in ("job.json", serve.SERVER_ARGS_FILE, "manifest.json")}
    assert mode == {"job.json": 0o600, serve.SERVER_ARGS_FILE: 0o600, "manifest.json": 0o644}
    assert URL_PASSWORD in (vdir / "job.json").read_text(), "the worker still gets the real URL"


def test_worker_events_redact_their_free_text_only(monkeypatch):
    """A message (an exception, a server URL) can quote a credential; the task and phase
    names and counts of a progress event cannot, and are sent as they are."""
    from evalpipe.worker import main
    from evalpipe.worker.main import Events

    scanned = []
    real = main.redact_text
    monkeypatch.setattr(main, "redact_text", lambda text: scanned.append(text) or real(text))
    events = Events.__new__(Events)  # not __init__: it would take over this process's stdout
    events._out, events._thinning = io.StringIO(), main.ProgressThinning()
    events.progress("gsm8k_synth_4shot", "generate", 8, 8)
    events.emit("error", kind="engine", message=f"no server at http://bob:{URL_PASSWORD}@127.0.0.1:9/v1")
    progress, error = (json.loads(line) for line in events._out.getvalue().splitlines())
    assert progress == {"v": 1, "event": "progress", "task": "gsm8k_synth_4shot", "phase": "generate", "done": 8, "total": 8}
    assert error["message"] == "no server at http://bob:***@127.0.0.1:9/v1" and error["kind"] == "engine"
    assert scanned == [error["message"].replace("***", URL_PASSWORD)], "only the message is scanned"
