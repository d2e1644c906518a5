"""The fork server and its client (evalpipe/execution/forkserver.py), with real processes: a
worker forked from the pre-imported interpreter runs as a new interpreter would (its argv,
working directory, environment, PYTHONPATH and sitecustomize), whatever the server cannot
start faithfully starts in a new interpreter, and nothing outlives a stop or a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import processes_of, wait_gone

from evalpipe.execution import launch
from evalpipe.execution.forkserver import RUN_MARK, comparable_env, exit_code, provided_names
from evalpipe.execution.preimport import Preimport

WORKER = """
import json, os, sys
print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(), "answer": os.environ.get("EVALPIPE_ANSWER"),
                  "path": sys.path[:3], "site": os.environ.get("SITE_RAN"), "main": __name__,
                  "parent": open(f"/proc/{os.getppid()}/cmdline", "rb").read().replace(b"\\0", b" ").decode()}), flush=True)
if sys.argv[1:2] == ["sleep"]:
    print("sleeping", flush=True)
    import time
    time.sleep(600)
sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture
def tree(tmp_path) -> dict:
    mods, site, work = tmp_path / "mods", tmp_path / "site", tmp_path / "work"
    for d in (mods, site, work):
        d.mkdir()
    (mods / "echo_worker.py").write_text(WORKER)
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    run_id = f"fork-{tmp_path.name}"
    env = {**os.environ, RUN_MARK: run_id, "EVALPIPE_ANSWER": "42", "PYTHONPATH": f"{site}{os.pathsep}{mods}"}
    env.pop("EVALPIPE_PREIMPORT", None)
    return {"mods": mods, "site": site, "work": work, "env": env, "run_id": run_id}


def _run(starter: Preimport, tree: dict, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = env or tree["env"]
    command = starter.command(sys.executable, [sys.executable, "-m", "echo_worker", *args], env)
    return subprocess.run(command, cwd=tree["work"], env=env, capture_output=True, text=True, timeout=120)


def test_a_forked_worker_runs_as_a_new_interpreter_would(tree):
    with Preimport(modules=("json",)) as starter:
        done = _run(starter, tree, "7", "x")
        assert done.returncode == 7, done.stderr
        assert "echo_worker runs as process" in done.stderr and "forked from a pre-imported interpreter" in done.stderr
        seen = json.loads(done.stdout)
        assert seen["argv"] == ["7", "x"] and seen["cwd"] == str(tree["work"]) and seen["main"] == "__main__"
        assert seen["answer"] == "42", "the request's environment, evalpipe's own variables included"
        assert seen["path"] == [str(tree["work"]), str(tree["site"]), str(tree["mods"])]
        assert seen["site"] == "yes", "the sitecustomize on its PYTHONPATH ran, as site.py runs it"
        assert "forkserver.py serve" in seen["parent"], seen
        # a second worker with other evalpipe variables is forked from the same server
        again = _run(starter, tree, "0", env={**tree["env"], "EVALPIPE_ANSWER": "43"})
        assert again.returncode == 0 and json.loads(again.stdout)["answer"] == "43"
        assert len(starter.servers) == 1


@pytest.mark.parametrize("change", ["environment", "shadowing path", "no server"])
def test_what_the_server_cannot_start_faithfully_starts_in_a_new_interpreter(tree, change):
    with Preimport(modules=("json", "colorsys")) as starter:
        env = dict(tree["env"])
        if change == "environment":
            starter.command(sys.executable, [sys.executable, "-m", "echo_worker"], env)  # the server of this environment
            command = starter.command(sys.executable, [sys.executable, "-m", "echo_worker", "3"], env)
            env["OMP_NUM_THREADS"] = "7"
            expected = "differs from the server's in OMP_NUM_THREADS"
        elif change == "shadowing path":
            (tree["mods"] / "colorsys.py").write_text("")  # another colorsys than the server imported
            command = starter.command(sys.executable, [sys.executable, "-m", "echo_worker", "3"], env)
            expected = "provides colorsys, imported here already"
        else:
            command = [sys.executable, "-I", str(Path(launch.__file__).with_name("forkserver.py")), "run",
                       str(tree["work"] / "nothing"), "--", sys.executable, "-m", "echo_worker", "3"]
            expected = "FileNotFoundError"
        done = subprocess.run(command, cwd=tree["work"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "a new interpreter for echo_worker (" in done.stderr and expected in done.stderr, done.stderr
    assert "forkserver.py serve" not in json.loads(done.stdout)["parent"]


def test_sigterm_to_the_client_stops_its_forked_worker_with_the_signals_code(tree):
    with Preimport(modules=("json",)) as starter:
        command = starter.command(sys.executable, [sys.executable, "-m", "echo_worker", "sleep"], tree["env"])
        proc = launch.guarded_popen(command, 5.0, cwd=tree["work"], env=tree["env"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() and proc.stdout.readline().strip() == "sleeping"
        launch.stop_group(proc, 5.0)
        assert proc.returncode == 128 + signal.SIGTERM
    assert wait_gone(tree["run_id"], 30) == []


def test_a_killed_client_takes_its_forked_worker_along(tree):
    with Preimport(modules=("json",)) as starter:
        command = starter.command(sys.executable, [sys.executable, "-m", "echo_worker", "sleep"], tree["env"])
        proc = subprocess.Popen(command, cwd=tree["work"], env=tree["env"], stdout=subprocess.PIPE, text=True)
        worker = json.loads(proc.stdout.readline())
        assert "forkserver.py serve" in worker["parent"] and proc.stdout.readline().strip() == "sleeping"
        server_pids = set(processes_of(tree["run_id"]))
        proc.kill()
        proc.wait()
        # the worker (the server's child) goes; the server stays for the run's next worker
        server_pids -= {proc.pid, worker["pid"]}
        assert wait_gone_but(tree["run_id"], server_pids) == server_pids
        assert _run(starter, tree, "0").returncode == 0
    assert wait_gone(tree["run_id"], 30) == []


def wait_gone_but(run_id: str, keep: set[int]) -> set[int]:
    """The run's processes once only those of ``keep`` that live are left (or after a minute)."""
    import time

    deadline = time.monotonic() + 60
    while not (left := set(processes_of(run_id))) <= keep and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_evalpipe_killed_by_sigkill_leaves_no_server_and_no_forked_worker(tree):
    parent = tree["work"] / "parent.py"
    parent.write_text(
        "import os, signal, subprocess, sys\n"
        "from evalpipe.execution.launch import guarded_popen\nfrom evalpipe.execution.preimport import Preimport\n"
        f"env = {tree['env']!r}\n"
        "starter = Preimport(modules=('json',))\n"
        "command = starter.command(sys.executable, [sys.executable, '-m', 'echo_worker', 'sleep'], env)\n"
        "proc = guarded_popen(command, 2.0, env=env, stdout=subprocess.PIPE, text=True)\n"
        "proc.stdout.readline(); print(proc.stdout.readline().strip(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**tree["env"], "PYTHONPATH": str(Path(launch.__file__).parents[2])}
    done = subprocess.run([sys.executable, str(parent)], cwd=tree["work"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL and done.stdout.strip() == "sleeping", done.stderr
    assert wait_gone(tree["run_id"], 30) == [], "the fork server or its child outlived evalpipe's SIGKILL"


def test_the_comparable_environment_and_the_names_a_path_entry_provides(tmp_path):
    env = {"PYTHONPATH": "/x", "EVALPIPE_LAYOUT": "sp", RUN_MARK: "r1", "OMP_NUM_THREADS": "1"}
    assert comparable_env(env) == {RUN_MARK: "r1", "OMP_NUM_THREADS": "1"}
    for name in ("torch", "json.py", "_C.cpython-311-x86_64-linux-gnu.so", "README.md", "x.txt", "1bad"):
        (tmp_path / name).mkdir() if "." not in name and name != "1bad" else (tmp_path / name).write_text("")
    assert provided_names(str(tmp_path)) == {"torch", "json", "_C"}
    assert provided_names(str(tmp_path / "absent")) == set()
    assert exit_code(0) == 0 and exit_code(3 << 8) == 3 and exit_code(signal.SIGKILL) == 128 + signal.SIGKILL
