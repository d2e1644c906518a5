"""A deployment's lifecycle on the fake server (evalpipe/execution/deployment.py): a head and a
headless node started through a launcher prefix that stands in for ssh on one machine, the
head healthy only once the other node's rank has joined (evalpipe/worker/fakes/rendezvous.py),
every node's process recorded by the probes with its node, and the ways a deployment fails:
a node that dies (at start or mid-run), a rank that never comes, evalpipe killed. What only
vLLM shows (its own handshake, engine cores per rank) is tests/e2e/test_deployment.py.

One run serves most of the module:
  single   the reference: one fake server
  spread   the same fake over two nodes            -> IDENTICAL, probes from both nodes
  lost     node 1 fails as it starts               -> failed, naming node 1 and its rank
  never    node 1 runs but its rank never joins    -> failed after ready_timeout_s, naming the rank
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import describe, processes_of, wait_gone

from evalpipe.config.run_config import Launch
from evalpipe.execution.deployment import DeploymentProcess, node_commands
from evalpipe.execution.serve import free_port
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV

FAKE_SERVER = [sys.executable, "-m", "evalpipe.worker.fakes.server"]
STANDIN = ["env", "EVALPIPE_STANDIN_NODE=1"]  # a launcher prefix, as [ssh, node1] would be
# a launcher that, like `kubectl exec`, stays attached to the command but does not pass its own
# end on: the command runs in a session of its own, out of the guard's process group
DETACHED = ["sh", "-c", 'setsid "$@" & wait', "detached"]
NEVER_JOINS = [sys.executable, "-c", "import time; time.sleep(600)"]  # runs, takes its flags, joins nothing
TASK = "gsm8k_synth_4shot"


def deployed(nodes_launchers: list[list[str]], **extra) -> dict:
    return {"mode": "serve", "command": FAKE_SERVER,
            "deployment": {"nodes": len(nodes_launchers), "launchers": nodes_launchers, "headless_command": FAKE_SERVER,
                           **extra.pop("deployment", {})}, **extra}


def fake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, FAKE_ENGINE_ENV: "1", **extra}


def write_config(tmp: Path, variants: dict) -> Path:
    cfg = {
        "model": {"path": "builtin:tiny-gsm"},
        # the worker leaves tokenizing to the fake server (no real tokenizer to load)
        "engine": {"max_model_len": 4096, "seed": 0, "data_parallel_size": 2, "tokenizer": "no-local-tokenizer"},
        "output": str(tmp / "runs"),
        "noise_floor": False,
        "capture": {"topk": 5, "teacher_forcing": True, "prompt_positions": {"min_prompt_tokens": 1 << 16}},
        "reference": "single",
        "variants": variants,
        "tasks": {"gsm8k": [{"task": TASK, "num_fewshot": 4}]},
    }
    path = tmp / "deployment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("deployment")
    path = write_config(tmp, {
        "single": {"launch": {"mode": "serve", "command": FAKE_SERVER}},
        "spread": {"launch": deployed([[], DETACHED]), "expect": {"same_path": True}},
        "lost": {"launch": deployed([[], ["env", f"{FAKE_ENGINE_ENV}=fail_start"]])},
        "never": {"launch": deployed([[], STANDIN], ready_timeout_s=8, deployment={"headless_command": NEVER_JOINS})},
    })
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", "3",
                           "--run-id", "dep"], cwd=tmp, capture_output=True, text=True, timeout=600, env=fake_env())
    return {"proc": proc, "dir": tmp / "runs" / "dep"}


def test_a_deployment_over_two_nodes_answers_as_one_server_and_every_node_is_recorded(run):
    run_dir = run["dir"]
    compare = json.loads((run_dir / "compare.json").read_text())
    spread = next(c for c in compare["comparisons"] if c["variant"] == "spread")
    assert spread["status"] == "IDENTICAL", run["proc"].stdout[-3000:]
    node1 = (run_dir / "spread" / "node-1.log").read_text()
    # the node was started through its launcher, told its environment on the command line, and joined
    assert "$ [node 1] sh -c setsid \"$@\" & wait detached env " in node1 and "EVALPIPE_NODE=1" in node1
    assert "--headless" in node1 and "--data-parallel-start-rank 1" in node1 and "fake headless node: joined" in node1
    assert "data-parallel ranks [1] joined" in (run_dir / "spread" / "engine.log").read_text()
    processes = json.loads((run_dir / "spread" / "probes.json").read_text())["processes"]
    assert sorted(p["node"] for p in processes) == ["0", "1"], processes
    assert all(p["models"][0]["model_class"].endswith("FakeEngine") for p in processes)


def _error(run: dict, variant: str) -> str:
    status = json.loads((run["dir"] / "run.json").read_text())["variant_status"][variant]
    assert status["exit_code"] == 3, status
    return status["error"]


def test_a_node_that_dies_fails_its_variant_naming_the_node_and_its_rank(run):
    error = _error(run, "lost")
    assert error.startswith("node 1, data-parallel rank 1, exited with code 1 before the variant finished"), error
    assert "the engine failed to start" in error  # the node's own log tail


def test_a_rank_that_never_joins_fails_after_the_ready_timeout_naming_it(run):
    error = _error(run, "never")
    assert "did not answer /health within 8s" in error, error
    assert "data-parallel rank 1 on node 1 never started an engine" in error, error


def test_the_run_fails_for_those_alone_and_leaves_nothing(run):
    proc = run["proc"]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "variants lost, never failed" in proc.stderr, proc.stderr[-2000:]
    left = wait_gone("dep", 30)
    assert left == [], describe(left)


def _fake_deployment(tmp: Path, launchers: list[list[str]]) -> tuple[DeploymentProcess, dict[str, str]]:
    launch = Launch.model_validate(deployed(launchers))
    port = free_port("127.0.0.1")
    env = fake_env(EVALPIPE_RUN_ID=f"direct-{os.getpid()}")
    commands = node_commands(sys.executable, launch, {"model": "m", "data_parallel_size": 2}, port=port,
                             address="127.0.0.1", rpc_port=free_port("127.0.0.1"), vdir=tmp)
    return DeploymentProcess(commands=commands, url=f"http://127.0.0.1:{port}", grace_s=5, ready_timeout_s=120), env


def test_a_node_killed_mid_run_takes_the_deployment_down_and_says_which(tmp_path):
    deployment, env = _fake_deployment(tmp_path, [[], STANDIN])
    deployment.start(env)
    try:
        while not deployment.healthy:  # the state, not a duration: the head answers once node 1 joined
            assert not deployment.died, deployment.death_message()
            time.sleep(0.1)
        head, other = deployment.nodes
        os.killpg(other.runner.proc.pid, signal.SIGKILL)
        while not deployment.died:
            time.sleep(0.1)
        assert deployment.death_message().startswith("node 1, data-parallel rank 1, was killed by SIGKILL")
        assert deployment.wait_gone(60), "the head outlived the node it needs"
        assert head.runner.proc.returncode is not None
    finally:
        deployment.stop()
    assert processes_of(env["EVALPIPE_RUN_ID"]) == []


def test_a_launcher_that_is_not_there_starts_nothing(tmp_path):
    deployment, env = _fake_deployment(tmp_path, [[], ["/nonexistent/ssh", "node1"]])
    with pytest.raises(OSError):
        deployment.start(env)
    assert deployment.wait_gone(60) and len(deployment.nodes) == 1, "the head started first is stopped again"


def test_evalpipe_killed_leaves_no_node_behind(tmp_path):
    path = write_config(tmp_path, {"single": {"launch": deployed([[], STANDIN])}})
    _kill_once_node_1_joined([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", "3",
                              "--run-id", "killed-node"], tmp_path, tmp_path / "runs" / "killed-node" / "single" / "node-1.log")
    left = wait_gone("killed-node", 60)
    assert left == [], describe(left)


def test_through_a_shell_launcher_every_word_comes_out_as_it_went_in(tmp_path):
    """`ssh node cmd args` joins its words into one line for the node's shell, which splits it
    again (as `sh -c LINE` does here): a JSON engine argument must arrive whole."""
    launch = Launch.model_validate({**deployed([[], ["ssh", "node1"]]),
                                    "deployment": {"nodes": 2, "launchers": [[], ["ssh", "node1"]], "headless_command": ["echo"]}})
    (_, node1) = node_commands(sys.executable, launch, {"model": "m", "data_parallel_size": 2,
                                                        "compilation_config": {"custom_ops": ["-rotary_embedding"]}},
                               port=1, address="127.0.0.1", rpc_port=2, vdir=tmp_path, forwarded={"A": "x y"})
    assert node1.argv[:2] == ["ssh", "node1"]
    shell = subprocess.run(["sh", "-c", " ".join(node1.argv[2:])], capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ["PATH"]})
    assert shell.stdout.startswith("--model m ") and shell.stdout.rstrip("\n").endswith(
        '--compilation-config {"custom_ops":["-rotary_embedding"]}'), shell


def test_a_node_s_records_come_back_through_its_launcher_and_only_that_node_s(tmp_path):
    """A node behind a launcher writes its probe records on its own disk; evalpipe fetches them
    through the launcher (tar to stdout). The stand-in launcher ignores the command it gets
    and packs a directory that plays the node's disk."""
    from evalpipe.config.deployment import Deployment, NodeRole
    from evalpipe.execution.deployment import LocalNode, NodeCommand

    remote = tmp_path / "node1-disk"
    remote.mkdir()
    (remote / "node1-77.json").write_text('{"node": "1"}')
    (remote / "node0-76.json").write_text('{"node": "0"}')  # another node's: not taken from there
    launcher = ("sh", "-c", f'tar -C "{remote}" -cf - .', "ignored")
    runner = LocalNode()
    runner.deployment = Deployment(nodes=2, remote_shell=False)
    runner.command = NodeCommand(NodeRole(1, 1, 1, launcher), [*launcher, "x"], tmp_path / "node-1.log")
    vdir = tmp_path / "variant"
    runner.bring_back(vdir)
    assert sorted(p.name for p in (vdir / "probes").iterdir()) == ["node1-77.json"]
    assert (vdir / "probes" / "node1-77.json").read_text() == '{"node": "1"}'


def test_evalpipe_killed_behind_a_launcher_that_keeps_the_node_running_and_resume_reaps_it_first(tmp_path):
    """With a launcher that does not pass its end on (as kubectl exec), a SIGKILL of evalpipe
    leaves the node's process running (no reaper runs then); --resume reaps what the run left
    on that node before it starts the node again, finishes, and leaves nothing."""
    # the fake headless node ends when its head goes away; a node whose processes outlive the
    # head (as a remote one may) is this wrapper, which stays after it
    stays = ["sh", "-c", '"$0" -m evalpipe.worker.fakes.server "$@"; sleep 600', sys.executable]
    path = write_config(tmp_path, {"single": {"launch": {"mode": "serve", "command": FAKE_SERVER}},
                                   "spread": {"launch": deployed([[], DETACHED], deployment={"headless_command": stays}),
                                              "expect": {"same_path": True}}})
    args = [sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", "3", "--run-id", "orphan"]
    _kill_once_node_1_joined(args, tmp_path, tmp_path / "runs" / "orphan" / "spread" / "node-1.log")
    # the guards take down what runs here; the node's process, out of their reach, stays
    _wait_until(lambda: processes_of("orphan") and all(_on_node_1(pid) for pid in processes_of("orphan")))
    orphans = processes_of("orphan")
    done = subprocess.run([*args, "--resume", str(tmp_path / "runs" / "orphan")], cwd=tmp_path, env=fake_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not any(pid in orphans for pid in processes_of("orphan")), "the earlier attempt's node was reaped"
    left = wait_gone("orphan", 60)
    assert left == [], describe(left)


def _kill_once_node_1_joined(args: list[str], cwd: Path, log: Path) -> None:
    """Run evalpipe (its fake engine slowed down) and SIGKILL it once node 1's log says it joined."""
    proc = subprocess.Popen(args, cwd=cwd, env=fake_env(EVALPIPE_FAKE_ENGINE="delay=0.5"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while "fake headless node: joined" not in (log.read_text() if log.is_file() else ""):
            assert proc.poll() is None, "the run ended before its node joined"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()


def _on_node_1(pid: int) -> bool:
    try:
        return b"EVALPIPE_NODE=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return True  # gone meanwhile: not one that stays


def _wait_until(condition, limit_s: float = 120) -> None:
    """Wait for a state; the limit only keeps a broken run from hanging the suite."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "the state never came"
        time.sleep(0.2)
