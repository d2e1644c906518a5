"""`evalpipe doctor`: everything that can be checked before an engine starts, one line per
check per variant, without starting any engine.

What a run would otherwise find out after minutes (or, for a large model on a cluster,
an hour): an interpreter that cannot import vLLM, a build without its NPU plugin, too
few devices for TP x DP, an incomplete model directory, task data not on this machine,
a taken port, an endpoint that serves another model, a full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import httpx

from evalpipe.cluster.checks import NodeFacts, deployment_short, devices_short, fits, gather, node_facts, unplaceable, version_problems
from evalpipe.cluster.session import ClusterUnavailable, connect, describe_cluster, describe_nodes, describe_resources, disconnect, nodes
from evalpipe.commands.deployment_checks import check_deployments
from evalpipe.config.errors import ConfigError
from evalpipe.config.ray_engine import ray_placed_engine
from evalpipe.data.longctx import TASK_PROBE
from evalpipe.documents.worker_job import ServerJob
from evalpipe.engine_patches.switches import requested
from evalpipe.errors import UserError
from evalpipe.execution.serve import port_is_free
from evalpipe.install import PACKAGE_DIR, code_version, shipped_dir
from evalpipe.models.builtin import ShippedModelError, ensure_builtin
from evalpipe.paths import data_dir
from evalpipe.pipeline.on_cluster import demand_of, nodes_of, units_of
from evalpipe.pipeline.plan import DEFAULT_ENV, PlannedVariant, RunPlan, model_file_problems
from evalpipe.probing import backends
from evalpipe.probing.names import check_variant, checks_lines, lookup_place, probed_names, resolve
from evalpipe.tasks import configure as task_lookup
from evalpipe.tasks.families import is_generated_ruler

MIN_FREE_DISK_BYTES = 1 << 30  # a GLM-5 run of 1319 questions with top-k logprobs stays well below

# Run under each variant's interpreter: what it imports, at which version and commit, and
# the questions only its vLLM can answer, all in one process (each new process imports vLLM
# again: seconds to tens of seconds).
_PROBE = r"""
import importlib, importlib.util, json, os, platform, subprocess, sys
from importlib import metadata

def commit(mod, path):
    try:
        c = getattr(importlib.import_module(mod + "._version"), "__commit_id__", None)
        if c:
            return c
    except Exception:
        pass
    try:  # a source checkout: <repo>/<mod>/__init__.py (not any repo a venv happens to sit in)
        top = subprocess.run(["git", "-C", path, "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True, timeout=5)
        lines = top.stdout.split()
        if top.returncode == 0 and os.path.realpath(lines[0]) == os.path.realpath(os.path.dirname(path)):
            return lines[1]
    except Exception:
        pass
    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower().replace("-", "_") in (mod, mod + "_cpu"):
            url = dist.read_text("direct_url.json")
            if url:
                return (json.loads(url).get("vcs_info") or {}).get("commit_id")
    return None

def package(mod):
    spec = importlib.util.find_spec(mod)
    if spec is None:
        return None
    path = os.path.dirname(spec.origin or "")
    try:
        m = importlib.import_module(mod)
    except Exception as err:
        return {"path": path, "error": f"{type(err).__name__}: {err}".splitlines()[0]}
    return {"path": path, "version": getattr(m, "__version__", None), "commit": commit(mod, path)}

out = {"python": platform.python_version()}
for mod in ("vllm", "vllm_ascend", "torch", "torch_npu"):
    out[mod] = package(mod)
spec = importlib.util.find_spec("evalpipe")  # the workers' evalpipe: this install's, through PYTHONPATH
out["evalpipe"] = {"path": os.path.realpath(os.path.dirname(spec.origin)) if spec and spec.origin else None,
                   "plugins": sorted(e.name for e in metadata.entry_points(group="vllm.general_plugins") if e.value.startswith("evalpipe."))}
if out["torch_npu"] and "error" not in out["torch_npu"]:
    import torch
    out["npu_count"] = torch.npu.device_count()

def first_line(err):
    return f"{type(err).__name__}: {err}".splitlines()[0]

# the questions (stdin): the engine patches' checks first, while no plugin has patched vLLM
# in this process; then vLLM's attention backend per request, which loads the plugins
asked = json.loads(sys.stdin.read() or "{}")
if asked.get("patches"):
    try:
        from evalpipe.engine_patches.checks import run_all
        out["patches"] = run_all()
    except Exception as err:
        out["patches"] = [["checks", False, f"cannot check the engine patches: {first_line(err)}"]]
out["backends"] = {}
for request in asked.get("backends", []):
    try:
        from evalpipe.engine_patches.backend_choice import choose
        out["backends"][request] = choose(json.loads(request))
    except Exception as err:
        out["backends"][request] = {"error": first_line(err)}
print("EVALPIPE_DOCTOR " + json.dumps(out))
"""
_MARK = "EVALPIPE_DOCTOR "

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


@dataclass(frozen=True)
class Check:
    scope: str  # a variant name, or "run" for what all variants share
    name: str
    ok: bool
    detail: str


def ask_interpreter(v: PlannedVariant, script: str, mark: str, timeout_s: float = 300, stdin: str | None = None) -> tuple[Any, str]:
    """Run ``script`` under the variant's interpreter and environment (``stdin`` its input):
    (the JSON it printed after ``mark``, "") or (None, why it could not be asked)."""
    try:
        proc = subprocess.run([v.python, "-c", script], input=stdin, capture_output=True, text=True, timeout=timeout_s,
                              env={**v.process_env(), "VLLM_LOGGING_LEVEL": "ERROR"})
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{v.python} did not run: {err}"
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(mark)), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{v.python} failed: {last}"
    return json.loads(line[len(mark):]), ""


@dataclass(frozen=True)
class Survey:
    """One interpreter and import path, asked once: what it imports (None: it could not be
    asked, ``why``), the engine patches' checks (None: no variant on it asks for patches),
    and vLLM's answer per attention-backend request (backend_choice's JSON)."""

    packages: dict[str, Any] | None
    why: str = ""
    patches: list[tuple[str, bool, str]] | None = None
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)


def survey_interpreter(v: PlannedVariant, backend_requests: list[str], patches: bool, timeout_s: float = 300) -> Survey:
    """Ask the variant's interpreter, under its environment, everything doctor needs from it
    in one process: its packages, the patches' checks when ``patches``, each request's backend."""
    answer, why = ask_interpreter(v, _PROBE, _MARK, timeout_s, stdin=json.dumps({"patches": patches, "backends": backend_requests}))
    if answer is None:
        return Survey(None, why)
    found = answer.pop("patches", None)
    return Survey(answer, "", None if found is None else [(str(n), bool(ok), str(d)) for n, ok, d in found],
                  answer.pop("backends", {}))


def survey_key(v: PlannedVariant) -> tuple[str, str]:
    """Variants on one interpreter and import path get the same answers."""
    return v.python, v.process_env().get("PYTHONPATH", "")


def backend_request(v: PlannedVariant, model_path: Path) -> str:
    return json.dumps(backends.request(model_path, v.engine_args), sort_keys=True, default=str)


def _package_line(name: str, info: dict[str, Any] | None) -> tuple[bool, str]:
    if info is None:
        return False, f"{name} is not installed"
    if "error" in info:
        return False, f"{name} fails to import: {info['error']}"
    commit = f", commit {info['commit'][:12]}" if info.get("commit") else ""
    return True, f"{name} {info.get('version') or '?'}{commit} ({info['path']})"


def check_evalpipe(info: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the variant's interpreter imports this evalpipe (a `python:` of another
    environment may hold its own, or none) and sees the vLLM plugins it registers."""
    ours = sorted(e.name for e in metadata.entry_points(group="vllm.general_plugins") if e.value.startswith("evalpipe."))
    where = f"shipped configs and tasks in {shipped_dir('configs').parent}"
    if not info or info.get("path") != str(PACKAGE_DIR):
        found = info.get("path") if info else None
        return False, f"the interpreter imports evalpipe from {found or 'nowhere'}, not from this install ({PACKAGE_DIR})"
    if not ours or info.get("plugins") != ours:
        return False, (f"the interpreter sees evalpipe's vLLM plugins {info.get('plugins') or 'none'}, this install declares {ours or 'none'}; "
                       "install evalpipe (pip install, not only a path to the checkout) so that vLLM loads them")
    return True, f"evalpipe {code_version()} from {PACKAGE_DIR} (vLLM plugins: {', '.join(ours)}); {where}"


def cann_version() -> str | None:
    """The CANN toolkit's version, from its install info (None when no toolkit is found)."""
    homes = [os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"), "/usr/local/Ascend/ascend-toolkit/latest"]
    for home in filter(None, homes):
        for info in (Path(home) / "version.cfg", *Path(home).glob("*/ascend_toolkit_install.info")):
            try:
                text = info.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition("=")
                if key.strip() in ("version", "toolkit_installed_version", "Version"):
                    return value.strip().strip('"[]').split(":")[-1]
    return None


def devices_needed(engine_args: dict[str, Any]) -> int:
    """Devices one node of this variant needs: TP x PP x the data-parallel ranks it hosts."""
    tp = int(engine_args.get("tensor_parallel_size") or 1)
    pp = int(engine_args.get("pipeline_parallel_size") or 1)
    dp = int(engine_args.get("data_parallel_size_local") or engine_args.get("data_parallel_size") or 1)
    return tp * pp * dp


def model_dir_problems(path: Path, engine_args: dict[str, Any]) -> list[str]:
    if not path.is_dir():
        return [f"{path} is not a directory"]
    problems = model_file_problems(path)
    config = path / "config.json"
    tokenizer_dir = Path(str(engine_args.get("tokenizer") or path))
    if not any((tokenizer_dir / f).is_file() for f in TOKENIZER_FILES):
        problems.append(f"no tokenizer ({' / '.join(TOKENIZER_FILES)}) in {tokenizer_dir}")
    if (engine_args.get("additional_config") or {}).get("enable_dsa_cp") and config.is_file():
        try:
            hf = json.loads(config.read_text())
        except ValueError:
            hf = {}
        if "index_topk" not in hf and "index_topk" not in (hf.get("text_config") or {}):
            problems.append("enable_dsa_cp is set but config.json has no index_topk (DSA-CP applies to DSA models only)")
    return problems


def _free_disk(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_endpoint(v: PlannedVariant, timeout_s: float = 10) -> tuple[bool, str]:
    launch = v.launch
    settings = ServerJob(url=launch.url or "", api_key_env=launch.api_key_env)
    url = settings.shown_url  # for the messages: without a password
    try:
        with httpx.Client(base_url=settings.url, timeout=timeout_s, headers=settings.headers()) as client:
            health = client.get("/health")
            models = client.get("/v1/models")
    except httpx.HTTPError as err:
        return False, f"{url} is not reachable ({type(err).__name__}); start the server or fix launch.url"
    if health.status_code != 200:
        return False, f"{url}/health answered {health.status_code} (engine not ready or dead)"
    if models.status_code != 200:
        return False, f"{url}/v1/models answered {models.status_code}; set launch.api_key_env if it needs a key"
    names = [m.get("id") for m in models.json().get("data", [])]
    if launch.served_model_name and launch.served_model_name not in names:
        return False, f"{url} serves {', '.join(names)}, not `{launch.served_model_name}`"
    if not launch.served_model_name and len(names) != 1:
        return False, f"{url} serves {len(names)} models; set launch.served_model_name"
    return True, f"{url} is up and serves {', '.join(names)}"


def run_checks(plan: RunPlan, say: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in order; ``say`` sees each one as soon as it is known."""
    for key, value in DEFAULT_ENV.items():  # never wait on a model hub (a tokenizer path that is not here)
        os.environ.setdefault(key, value)
    checks: list[Check] = []

    def add(scope: str, name: str, ok: bool, detail: str) -> None:
        check = Check(scope, name, ok, detail)
        checks.append(check)
        if say is not None:
            say(check)

    device = plan.config.device
    model_path = _model_path(plan, add)
    _check_tasks(plan, model_path, add)
    free = _free_disk(plan.run_dir.parent)
    add("run", "disk", free >= MIN_FREE_DISK_BYTES,
        f"{free / 2**30:.1f} GiB free under {plan.run_dir.parent}" + ("" if free >= MIN_FREE_DISK_BYTES else "; need at least 1 GiB"))
    if device == "npu":
        cann = cann_version()
        add("run", "CANN", cann is not None, f"CANN {cann}" if cann else
            "no CANN toolkit found (ASCEND_TOOLKIT_HOME, /usr/local/Ascend/ascend-toolkit/latest); source its set_env.sh")

    local = [v for v in plan.variants if v.launch.mode != "endpoint"]
    # what each interpreter will be asked, gathered first: one process answers it all
    questions: dict[tuple[str, str], tuple[list[str], bool]] = {}
    for v in local:
        requests, patches = questions.get(survey_key(v), ([], False))
        if _asks_backend(v, model_path, device):
            assert model_path is not None
            request = backend_request(v, model_path)
            requests = requests if request in requests else [*requests, request]
        questions[survey_key(v)] = (requests, patches or requested(v.env_overrides).anything)
    surveys: dict[tuple[str, str], Survey] = {}
    looked_up: dict[tuple[str, str], Any] = {}
    for v in plan.variants:
        if v.launch.mode == "endpoint":
            add(v.name, "endpoint", *check_endpoint(v))
            add(v.name, "path probes", False, "path not verifiable in endpoint mode (the server runs outside evalpipe, "
                "its code cannot be probed): every comparison with this variant will be INCONCLUSIVE")
            continue
        where = survey_key(v)
        if where not in surveys:
            surveys[where] = survey_interpreter(v, *questions[where])
        survey = surveys[where]
        info = survey.packages
        add(v.name, "interpreter", info is not None, f"{v.python}: Python {info['python']}" if info else survey.why)
        if info is None:
            continue
        add(v.name, "vllm", *_package_line("vllm", info.get("vllm")))
        add(v.name, "evalpipe", *check_evalpipe(info.get("evalpipe")))
        add(v.name, "path probes", *check_probe_names(v, plan, looked_up))
        if requested(v.env_overrides).anything:
            for name, ok, detail in survey.patches or []:
                add(v.name, f"engine patch: {name}", ok, detail)
        if device == "npu":
            add(v.name, "vllm_ascend", *_package_line("vllm_ascend", info.get("vllm_ascend")))
            add(v.name, "torch_npu", *_package_line("torch_npu", info.get("torch_npu")))
            needed, visible = devices_needed(v.engine_args), info.get("npu_count")
            add(v.name, "devices", visible is not None and visible >= needed,
                f"{visible if visible is not None else 'no'} NPUs visible, TP x PP x DP needs {needed} on this node")
        else:
            add(v.name, "torch", *_package_line("torch", info.get("torch")))
        if model_path is not None:
            problems = model_dir_problems(model_path, v.engine_args)
            add(v.name, "model", not problems, f"{model_path}: " + ("; ".join(problems) if problems else "config.json, weights, tokenizer"))
            if _asks_backend(v, model_path, device):
                backend = check_attention_backend(v, survey.backends[backend_request(v, model_path)])
                if backend is not None:
                    add(v.name, "attention backend", *backend)
        if v.launch.mode == "serve" and v.launch.deployment is None:  # a deployment's head: check_deployments
            if v.launch.port is None:
                add(v.name, "port", True, f"a free port on {v.launch.host} is chosen at start")
            else:
                free_port = port_is_free(v.launch.host, v.launch.port)
                add(v.name, "port", free_port, f"{v.launch.host}:{v.launch.port} " + ("is free" if free_port else "is taken; stop what listens there or change launch.port"))
    check_deployments(plan, model_path, add)
    if plan.config.cluster.enabled:
        _check_cluster(plan, model_path, add)
    return checks


def _check_cluster(plan: RunPlan, model_path: Path | None, add) -> None:
    """The Ray cluster the run will use: reachable, the same versions on every node, every
    variant placeable, its interpreter and the model present where it may run."""
    address = str(plan.config.cluster.address)
    try:
        ray = connect(address)
    except ClusterUnavailable as err:
        add("cluster", "reachable", False, f"{err} (the other cluster checks need it)")
        return
    try:
        live = [n for n in nodes(ray) if n.alive]
        add("cluster", "reachable", bool(live), f"{address}: {describe_cluster(ray)}")
        if not live:
            return
        units = units_of(plan, kept=[])
        demands = [(" + ".join(v.name for v in unit), demand_of(plan, unit)) for unit in units]
        problems = unplaceable(demands, live, plan.config.cluster.distinct_nodes)
        problems += [short for unit, (name, demand) in zip(units, demands)
                     if (short := deployment_short(name, demand, nodes_of(unit), live)) is not None]
        add("cluster", "placeable", not problems,
            "; ".join(problems) + f"; the cluster has {describe_nodes(live)}" if problems
            else f"{len(units)} unit(s) fit{' on distinct nodes' if plan.config.cluster.distinct_nodes else ''}: "
                 + ", ".join(f"{name} {describe_resources(d)}" for name, d in demands))
        for unit in units:
            engine = ray_placed_engine(unit[0].engine_args) if unit[0].launch.mode != "endpoint" else None
            if engine is not None:
                short = devices_short(engine.ranks, live)
                add(unit[0].name, "engine ranks", short is None,
                    f"{engine.describe()}, but {short}" if short else f"{engine.describe()}: the cluster has them")
        paths = sorted({v.python for v in plan.variants if v.launch.mode != "endpoint"}
                       | ({str(model_path)} if model_path is not None else set()))
        facts = {f.node_id: f for f in gather(ray, live, paths)}
        mine = NodeFacts(**node_facts([]))  # the driver's, read as every node's are
        differ = version_problems(mine, list(facts.values()))
        add("cluster", "versions", not differ,
            "; ".join(differ) + "; install the driver's versions on every node" if differ
            else f"Ray {mine.ray}, evalpipe {mine.evalpipe}, Python {mine.python} on all {len(facts)} node(s)")
        for unit, (_, demand) in zip(units, demands):
            hosts = [n for n in live if fits(demand, n.total)]
            for variant in unit:
                wanted = [variant.python] + ([str(model_path)] if model_path is not None else [])
                missing = [f"{path} on {facts[n.node_id].hostname} ({n.node_id[:12]})"
                           for n in hosts for path in wanted if not facts[n.node_id].present.get(path, False)]
                add(variant.name, "on its nodes", not missing,
                    "missing: " + "; ".join(missing) + " (every node that may run it needs them at the driver's paths)"
                    if missing else f"interpreter and model present on the {len(hosts)} node(s) that can run it")
    finally:
        disconnect()


def _asks_backend(v: PlannedVariant, model_path: Path | None, device: str) -> bool:
    """Whether doctor asks the variant's vLLM for its attention backend: on the CPU platform
    (an accelerator build chooses per device, at start), for a model directory that is whole."""
    return model_path is not None and device in ("auto", "cpu") and not model_dir_problems(model_path, v.engine_args)


def check_attention_backend(v: PlannedVariant, answer: dict[str, Any]) -> tuple[bool, str] | None:
    """The attention backend vLLM's CPU build will pick on this processor (``answer``: what
    the variant's vLLM said), against the model's dtype and the variant's expectations
    (evalpipe.probing.backends); None off the CPU platform."""
    choice = backends.answered(answer)
    if choice is None:
        return None  # not vLLM's CPU platform: the probes record what the device built
    if isinstance(choice, str):
        return False, choice
    return backends.judge(choice, backends.expected_backends(v.expect.switches))


def check_probe_names(v: PlannedVariant, plan: RunPlan, looked_up: dict[tuple[str, str], Any] | None = None) -> tuple[bool, str]:
    """Every name the run probes, looked up in the variant's interpreter; what will be checked.
    ``looked_up``: this doctor run's lookups, by interpreter and import path, as the run plans
    them (evalpipe.probing.names.resolve_plan): an A/A pair's variants import vLLM once."""
    looked_up = {} if looked_up is None else looked_up
    env = v.process_env()
    where = lookup_place(v.python, env)
    try:
        if where not in looked_up:
            looked_up[where] = resolve(v.python, env, probed_names(p.expect for p in plan.variants))
        check_variant(v.name, v.python, v.expect, looked_up[where])
    except ConfigError as err:
        return False, str(err)
    return True, "; ".join(checks_lines(v))


def _model_path(plan: RunPlan, add) -> Path | None:
    if plan.builtin_model:
        try:
            model = ensure_builtin(plan.builtin_model)
        except ShippedModelError as err:
            add("run", "model", False, str(err))
            return None
        add("run", "model", True, f"builtin:{plan.builtin_model} shipped files verified (fingerprint {model.fingerprint[:12]})")
        return model.path
    path = Path(plan.model).expanduser()
    if not path.is_dir():
        add("run", "model", False, f"model directory {path} does not exist on this machine; fix model.path")
        return None
    return path


def _check_tasks(plan: RunPlan, model_path: Path | None, add) -> None:
    """Resolve every task as the worker will (local data found or generated, RULER items
    built with the model's tokenizer), in this process."""
    tokenizer = str(plan.config.model.tokenizer or model_path or plan.model)
    generated = task_lookup.LongCtxData(tokenizer, plan.config.longctx.model_dump(mode="json"), seed=plan.config.seed,
                                        scenario_spec=plan.config.scenarios.resolved(plan.config.engine))
    for t in plan.tasks:
        try:
            # lm-eval and RULER's generators print progress bars; the check's line is the output
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                task_lookup.task_config(t.spec, data_dir(), generated=generated)
        except (UserError, FileNotFoundError, ValueError, OSError) as err:  # TaskNotFound among the first
            detail = str(err)
            if _needs_tokenizer(t.spec.task) and not Path(tokenizer).expanduser().exists():
                detail = f"its items are built with the model's tokenizer, and {tokenizer} is not on this machine"
            add("run", f"task {t.spec.task}", False, detail)
        else:
            add("run", f"task {t.spec.task}", True, "data present locally")


def _needs_tokenizer(task: str) -> bool:
    return task in TASK_PROBE or is_generated_ruler(task)
