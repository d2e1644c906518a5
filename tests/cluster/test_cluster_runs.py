"""`evalpipe run` on a real Ray cluster of three nodes on 127.0.0.1 (tests/support/ray_cluster.py), with
the fake engine in every worker (what only vLLM shows on a cluster is tests/e2e/test_run.py):
the variants at once on distinct nodes give the local run's verdict and byte-identical
artifacts, with the nodes' scratch directories or a shared run directory; a served variant
on a remote node; a variant the cluster cannot place fails alone, in one sentence; a killed
actor fails only its variant and --resume finishes it; Ctrl-C stops every node's processes.
After each run no evalpipe actor, placement group or worker process is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import in_process
import pytest
from processes import describe, wait_gone
from ray_cluster import TASK, leftovers, write_config

from evalpipe.cluster.local import join, marked_pids
from evalpipe.rundir import artifacts
from evalpipe.rundir.integrity import sha256_of, verify_variant
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV

LIMIT = 4
TABLES = (artifacts.SAMPLES_PARQUET, artifacts.TOKENS_PARQUET, artifacts.TEACHER_PARQUET)
FAKE_SERVER = [sys.executable, "-m", "evalpipe.worker.fakes.server"]


def evalpipe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return in_process.evalpipe(*args, cwd=cwd, env={"RAY_AUTH_MODE": "disabled"})


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def assert_nothing_left(cluster, run_id: str) -> None:
    left_running = wait_gone(run_id, 30)
    assert left_running == [], f"processes of run {run_id} outlived it: {describe(left_running)}"
    left = leftovers(cluster)
    assert left["actors"] == [] and left["groups"] == [], left
    assert left["nodes"] == 3


AB = {
    "ref": {},
    "other": {"env": {FAKE_ENGINE_ENV: "diverge=3"}},
}


@pytest.fixture(scope="module")
def local_and_cluster(cluster, tmp_path_factory) -> dict:
    """The same A/B with its A/A run (three variants) here, one after another, and on the
    cluster, each variant on a node of its own (artifacts back through Ray)."""
    tmp = tmp_path_factory.mktemp("ab")
    spread = {"address": cluster.address, "distinct_nodes": True, "scratch": str(tmp / "scratch")}
    path = write_config(tmp, "ab", AB, spread, noise_floor=True)
    here = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "here", "--cluster", "off", cwd=tmp)
    there = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "there", cwd=tmp)
    return {"tmp": tmp, "here": here, "there": there, "path": path}


def test_the_variants_run_at_once_on_three_nodes_with_the_local_verdict(cluster, local_and_cluster):
    here, there = local_and_cluster["here"], local_and_cluster["there"]
    assert here.returncode == 1, here.stdout[-3000:] + here.stderr[-3000:]  # DIVERGENT: `other` differs
    assert there.returncode == here.returncode, there.stdout[-3000:] + there.stderr[-3000:]
    runs = local_and_cluster["tmp"] / "runs"
    local, remote = run_json(runs / "here"), run_json(runs / "there")
    assert remote["verdict"] == local["verdict"] == "DIVERGENT"
    assert "placements" not in local
    placed = remote["placements"]
    assert set(placed) == {"ref", "ref-aa", "other"}
    assert len({p["node_id"] for p in placed.values()}) == 3, "distinct_nodes: every variant on a node of its own"
    assert all(p["resources"].get("CPU") == 1.0 and not p["shared_filesystem"] for p in placed.values())
    assert "3 unit(s)" in there.stdout and "runs on node" in there.stdout
    report = (runs / "there" / "report.md").read_text()
    for name, p in placed.items():
        assert f"{name} ran on" in report and p["node_id"][:12] in report, "the report says where each variant ran"
    assert_nothing_left(cluster, "there")
    assert not any((local_and_cluster["tmp"] / "scratch").rglob("*.parquet")), "the nodes' scratch copies were cleared"


def test_the_cluster_run_writes_the_local_runs_bytes(local_and_cluster):
    runs = local_and_cluster["tmp"] / "runs"
    for variant in ("ref", "ref-aa", "other"):
        vdir = artifacts.VariantDir(runs / "there" / variant)
        verify_variant(vdir)  # every artifact against the manifest written on its node
        assert vdir.engine_log.is_file() and vdir.engine_log.stat().st_size > 0, "the node's log came back"
        assert (vdir.root / artifacts.PROBES_JSON).is_file()
        for table in TABLES:
            assert sha256_of(vdir.root / table) == sha256_of(runs / "here" / variant / table), f"{variant}/{table}"
    compared = json.loads((runs / "there" / "compare.json").read_text())
    assert [(c["variant"], c["status"], c["reasons"]) for c in compared["comparisons"]] == \
        [(c["variant"], c["status"], c["reasons"]) for c in json.loads((runs / "here" / "compare.json").read_text())["comparisons"]]


def test_a_shared_run_directory_gives_the_same_bytes(cluster, local_and_cluster):
    tmp = local_and_cluster["tmp"]
    path = write_config(tmp, "shared", AB, {"address": cluster.address, "shared_filesystem": True}, noise_floor=True)
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "shared", cwd=tmp)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    runs = tmp / "runs"
    assert all(p["shared_filesystem"] for p in run_json(runs / "shared")["placements"].values())
    for variant in ("ref", "ref-aa", "other"):
        verify_variant(artifacts.VariantDir(runs / "shared" / variant))
        for table in TABLES:
            assert sha256_of(runs / "shared" / variant / table) == sha256_of(runs / "here" / variant / table)
    assert_nothing_left(cluster, "shared")


def test_a_served_variant_runs_on_the_node_it_asks_for_with_its_aa_run_on_its_server(cluster, tmp_path):
    variants = {
        "served": {"launch": {"mode": "serve", "command": FAKE_SERVER}, "engine": {"tokenizer": "no-local-tokenizer"},
                   "resources": {"CPU": 1, "node_c": 1}},
        "offline": {"resources": {"CPU": 1, "node_a": 1}, "expect": {"same_path": True}},
    }
    path = write_config(tmp_path, "served", variants, {"address": cluster.address}, noise_floor={"reuse_server": True})
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "served", cwd=tmp_path)
    info = run_json(tmp_path / "runs" / "served")
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert {n: s["exit_code"] for n, s in info["variant_status"].items()} == {"served": 0, "served-aa": 0, "offline": 0}
    placed = info["placements"]
    assert placed["served"]["resources"].get("node_c") == 1.0 and placed["offline"]["resources"].get("node_a") == 1.0
    assert placed["served-aa"]["node_id"] == placed["served"]["node_id"], "the A/A run used its reference's server"
    assert "served + served-aa" in done.stdout
    served = artifacts.VariantDir(tmp_path / "runs" / "served" / "served")
    verify_variant(served)
    assert served.engine_log.is_file() and served.worker_log.is_file(), "the server's and the worker's logs came back"
    verify_variant(artifacts.VariantDir(tmp_path / "runs" / "served" / "served-aa"))
    assert_nothing_left(cluster, "served")


def test_a_variant_the_cluster_cannot_place_or_that_hangs_fails_alone(cluster, tmp_path):
    """One variant asks for a resource no node has, another hangs (its node's watchdog stops
    it): both fail in one sentence each, the others run and are compared."""
    variants = {"ref": {}, "same": {"expect": {"same_path": True}}, "nowhere": {"resources": {"node_z": 1}},
                "hung": {"env": {FAKE_ENGINE_ENV: "hang_after=2"}, "launch": {"stall_timeout_s": 3}}}
    path = write_config(tmp_path, "nowhere", variants, {"address": cluster.address, "placement_timeout_s": 7})
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "nowhere", cwd=tmp_path)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    info = run_json(tmp_path / "runs" / "nowhere")
    err = info["variant_status"]["nowhere"]["error"]
    assert "could not be placed on the Ray cluster" in err and "{node_z: 1}" in err and "3 nodes" in err, err
    hung = info["variant_status"]["hung"]["error"]
    assert str(tmp_path / "runs" / "nowhere" / "hung" / "engine.log") in hung, "the log is named where it is now"
    assert "variant nowhere waits to be placed ({node_z: 1}" in " ".join(done.stdout.split()), "it said it was waiting"
    assert sorted(info["failed_variants"]) == ["hung", "nowhere"]
    assert info["variant_status"]["hung"]["stalled"] is True and "made no progress" in info["variant_status"]["hung"]["error"]
    assert info["variant_status"]["same"]["exit_code"] == 0, "the other variants ran and were compared"
    assert info["verdict"]
    assert_nothing_left(cluster, "nowhere")


def test_more_variants_than_the_cluster_holds_run_as_capacity_frees(cluster, tmp_path):
    """Four variants of one CPU each on three one-CPU nodes: the fourth waits for one of the
    run's own to end, longer than the placement timeout (which counts only while none of the
    run's variants is running), then runs; all four are compared."""
    slow = {"env": {FAKE_ENGINE_ENV: "delay=1"}, "expect": {"same_path": True}}
    variants = {"ref": dict(slow), "b": dict(slow), "c": dict(slow), "d": dict(slow)}
    path = write_config(tmp_path, "four", variants, {"address": cluster.address, "placement_timeout_s": 2})
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "four", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "waits to be placed ({CPU: 1}; until the run's other variants end)" in " ".join(done.stdout.split())
    info = run_json(tmp_path / "runs" / "four")
    assert info["verdict"] == "IDENTICAL" and set(info["placements"]) == {"ref", "b", "c", "d"}
    assert_nothing_left(cluster, "four")


def test_a_failed_reference_stops_the_variants_running_beside_it(cluster, tmp_path):
    """`slow` holds after its first request until a file appears that nobody writes: the run
    can only end because evalpipe stopped it when the reference failed (a state, not a time)."""
    never = tmp_path / "never-written"
    variants = {"ref": {"env": {FAKE_ENGINE_ENV: "exit_after=2"}}, "slow": {"env": {FAKE_ENGINE_ENV: f"hold={never}"}}}
    path = write_config(tmp_path, "ref-fails", variants, {"address": cluster.address})
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", "16", "--run-id", "ref-fails", cwd=tmp_path)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    info = run_json(tmp_path / "runs" / "ref-fails")
    assert info["status"] == "failed" and "ref" in info["error"]
    assert info["variant_status"].get("slow", {}).get("exit_code") != 0, info["variant_status"]
    assert not never.exists()
    assert_nothing_left(cluster, "ref-fails")


def start(args: list[str], cwd: Path, err) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evalpipe", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=err,
                            text=True, start_new_session=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def wait_for_line(proc: subprocess.Popen, needle: str, err) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if needle in line:
            return
    err.seek(0)
    raise AssertionError(f"the run ended before `{needle}`: {proc.wait()} {err.read()[-3000:]}")


def interrupted_run(args: list[str], tmp_path: Path, needle: str, interrupt, timeout_s: float = 180) -> tuple[int, float, str]:
    """Start `evalpipe` with ``args``; once its output shows ``needle``, call ``interrupt(proc)``.
    Returns its exit code, seconds from the interrupt to its exit, and its stderr on one line."""
    with open(tmp_path / "err", "w+") as err:
        proc = start(args, tmp_path, err)
        try:
            wait_for_line(proc, needle, err)
            started = time.monotonic()
            interrupt(proc)
            code = proc.wait(timeout=timeout_s)
            took = time.monotonic() - started
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        err.seek(0)
        return code, took, " ".join(err.read().split())


_KILL_ACTOR = """
import ray, sys
from evalpipe.cluster.loopback import pin_to_loopback
pin_to_loopback()
ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", logging_level="ERROR", log_to_driver=False)
ray.kill(ray.get_actor(sys.argv[2], namespace="evalpipe"))
"""


def test_a_killed_actor_fails_only_its_variant_and_resume_finishes_it(cluster, tmp_path):
    # `slow` holds after its first request until the test writes `release`: the kill lands while it runs
    release = tmp_path / "release"
    variants = {"ref": {}, "slow": {"env": {FAKE_ENGINE_ENV: f"hold={release}"}, "expect": {"same_path": True}}}
    path = write_config(tmp_path, "killed", variants, {"address": cluster.address})
    args = ["run", "gsm8k", "-c", str(path), "--limit", "8", "--run-id", "killed"]

    def kill_actor(_proc):
        subprocess.run([sys.executable, "-c", _KILL_ACTOR, cluster.address, "killed/slow"], check=True, timeout=60,
                       env={**os.environ, **cluster.env()})

    code, _, said = interrupted_run(args, tmp_path, f"slow · {TASK} · generate:", kill_actor)
    release.write_text("")  # the resumed run's `slow` goes through
    assert code == 3, said[-2000:]
    assert "the Ray actor running variant slow" in said and "died" in said and "--resume" in said, said[-2000:]
    run_dir = tmp_path / "runs" / "killed"
    info = run_json(run_dir)
    assert info["failed_variants"] == ["slow"] and info["variant_status"]["ref"]["exit_code"] == 0
    assert_nothing_left(cluster, "killed")  # the actor's guard took its worker down with it

    resumed = evalpipe(*args, "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "kept (finished, artifacts verified): ref" in " ".join(resumed.stdout.split())
    info = run_json(run_dir)
    assert info["status"] == "ok" and info["verdict"] == "IDENTICAL"
    assert set(info["placements"]) == {"ref", "slow"}
    verify_variant(artifacts.VariantDir(run_dir / "slow"))
    assert_nothing_left(cluster, "killed")


def test_a_node_that_dies_mid_run_fails_only_its_variant_and_resume_finishes_it_on_another(cluster, tmp_path):
    """The machine under a variant dies (its raylet, its actor, the worker: SIGKILL, all at
    once): that variant fails, the reference finishes, and --resume runs it on a new node."""
    far = {"CPU": 1, "node_d": 1}
    doomed = join(cluster.address, far, Path(tempfile.mkdtemp(prefix="evp-doomed-", dir="/tmp")), live_after=4)
    release = tmp_path / "release"  # `far` holds after its first request until then: the node dies while it runs
    variants = {"ref": {}, "far": {"resources": far, "env": {FAKE_ENGINE_ENV: f"hold={release}"}, "expect": {"same_path": True}}}
    path = write_config(tmp_path, "node-dies", variants, {"address": cluster.address})
    args = ["run", "gsm8k", "-c", str(path), "--limit", "8", "--run-id", "node-dies"]
    try:
        code, _, said = interrupted_run(args, tmp_path, f"far · {TASK} · generate:",
                                        lambda _proc: [os.kill(pid, signal.SIGKILL) for pid in marked_pids(doomed.root)])
        assert code == 3, said[-2000:]
    finally:
        doomed.stop()
    release.write_text("")
    assert "the Ray actor running variant far" in said and "died" in said and "--resume" in said, said[-2000:]
    run_dir = tmp_path / "runs" / "node-dies"
    info = run_json(run_dir)
    assert info["failed_variants"] == ["far"] and info["variant_status"]["ref"]["exit_code"] == 0
    dead_node = info["placements"]["far"]["node_id"]
    spare = join(cluster.address, far, Path(tempfile.mkdtemp(prefix="evp-spare-", dir="/tmp")), live_after=4)
    try:
        done = evalpipe(*args, "--resume", str(run_dir), cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "kept (finished, artifacts verified): ref" in " ".join(done.stdout.split())
        info = run_json(run_dir)
        assert info["status"] == "ok" and info["verdict"] == "IDENTICAL"
        assert info["placements"]["far"]["node_id"] != dead_node, "run again on the node that joined"
        verify_variant(artifacts.VariantDir(run_dir / "far"))
        assert wait_gone("node-dies", 30) == []
    finally:
        spare.stop()
    assert leftovers(cluster)["actors"] == [] and leftovers(cluster)["groups"] == []


def test_ctrl_c_stops_every_nodes_processes_and_leaves_nothing_on_the_cluster(cluster, tmp_path):
    held = {"env": {FAKE_ENGINE_ENV: f"hold={tmp_path / 'never-written'}"}}  # running until stopped: Ctrl-C lands mid-run
    variants = {"ref": held, "b": held}
    path = write_config(tmp_path, "ctrl-c-cluster", variants, {"address": cluster.address, "distinct_nodes": True})
    code, _, said = interrupted_run(["run", "gsm8k", "-c", str(path), "--limit", "8", "--run-id", "ctrl-c-cluster"],
                                             tmp_path, f"· {TASK} · generate:", lambda proc: proc.send_signal(signal.SIGINT),
                                             timeout_s=120)
    assert code == 130, said[-2000:]
    info = run_json(tmp_path / "runs" / "ctrl-c-cluster")
    assert info["status"] == "interrupted" and info["interrupted_by"] == "SIGINT"
    assert_nothing_left(cluster, "ctrl-c-cluster")


def test_a_driver_killed_by_sigkill_leaves_nothing_and_resume_finishes_the_run(cluster, tmp_path):
    """kill -9 of evalpipe itself: Ray ends the actors its job owned and removes its placement
    groups, each actor's guard takes its worker down; --resume runs what had not finished."""
    release = tmp_path / "release"  # `slow` holds after its first request until then: the kill lands mid-run
    variants = {"ref": {}, "slow": {"env": {FAKE_ENGINE_ENV: f"hold={release}"}, "expect": {"same_path": True}}}
    path = write_config(tmp_path, "kill-9", variants, {"address": cluster.address})
    args = ["run", "gsm8k", "-c", str(path), "--limit", "8", "--run-id", "kill-9"]
    code, _, _ = interrupted_run(args, tmp_path, f"slow · {TASK} · generate:", lambda proc: os.kill(proc.pid, signal.SIGKILL),
                                 timeout_s=30)
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while (left := leftovers(cluster)) != {"actors": [], "groups": [], "nodes": 3} and time.monotonic() < deadline:
        time.sleep(2)
    assert left == {"actors": [], "groups": [], "nodes": 3}
    assert wait_gone("kill-9", 30) == []
    run_dir = tmp_path / "runs" / "kill-9"
    release.write_text("")
    resumed = evalpipe(*args, "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    info = run_json(run_dir)
    assert info["status"] == "ok" and info["verdict"] == "IDENTICAL"
    assert_nothing_left(cluster, "kill-9")


def _deployed(resources: dict | None = None, **env: str) -> dict:
    """A variant whose fake engine spans two nodes (a head and a headless node) that Ray places."""
    return {"launch": {"mode": "serve", "command": FAKE_SERVER,
                       "deployment": {"nodes": 2, "headless_command": FAKE_SERVER}},
            "engine": {"tokenizer": "no-local-tokenizer", "data_parallel_size": 2},
            **({"resources": resources} if resources else {}), **({"env": env} if env else {}),
            "expect": {"same_path": True, "deployment": {"nodes": 2}}}


def test_a_deployment_s_nodes_are_placed_by_ray_on_distinct_nodes_and_each_is_recorded(cluster, tmp_path):
    variants = {"ref": {"launch": {"mode": "serve", "command": FAKE_SERVER}, "engine": {"tokenizer": "no-local-tokenizer"}},
                "spread": _deployed()}
    path = write_config(tmp_path, "deployed", variants, {"address": cluster.address, "scratch": str(tmp_path / "scratch")})
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "deployed", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "deployed"
    assert run_json(run_dir)["verdict"] == "IDENTICAL"
    said = " ".join(done.stdout.split())
    assert "variant spread: node 1 of its deployment on 127.0.0.1" in said, said[-3000:]
    spread = run_dir / "spread"
    # node 1's log and probe record came back from its node into the run directory
    assert "fake headless node: joined" in (spread / "node-1.log").read_text()
    processes = json.loads((spread / "probes.json").read_text())["processes"]
    assert sorted(p["node"] for p in processes) == ["0", "1"], processes
    compare = json.loads((run_dir / "compare.json").read_text())["comparisons"][0]
    assert compare["paths"]["status"] == "verified", compare["paths"]
    assert any("model built on 2 nodes" in e or "node 0" in e for c in compare["paths"]["checks"] for e in c["evidence"])
    assert_nothing_left(cluster, "deployed")


def test_a_deployment_s_node_that_dies_fails_only_its_variant_and_resume_finishes_it(cluster, tmp_path):
    """Two nodes hold the resource the deployment asks for; one of them dies mid-run (its
    raylet and every process of it): the deployment's variant fails, the reference finishes,
    nothing of the deployment is left on the surviving node, and --resume runs it again once a
    spare node has joined."""
    pair = {"CPU": 1, "pair": 1}
    steady = join(cluster.address, pair, Path(tempfile.mkdtemp(prefix="evp-steady-", dir="/tmp")), live_after=4)
    doomed = join(cluster.address, pair, Path(tempfile.mkdtemp(prefix="evp-doomed-", dir="/tmp")), live_after=5)
    release = tmp_path / "release"  # `spread` holds after its first request until then: the node dies mid-run
    variants = {"ref": {}, "spread": _deployed(pair, **{FAKE_ENGINE_ENV: f"hold={release}"})}
    path = write_config(tmp_path, "deployment-dies", variants, {"address": cluster.address})
    args = ["run", "gsm8k", "-c", str(path), "--limit", "8", "--run-id", "deployment-dies"]
    spare = None
    try:
        code, _, said = interrupted_run(args, tmp_path, f"spread · {TASK} · generate:",
                                        lambda _proc: [os.kill(pid, signal.SIGKILL) for pid in marked_pids(doomed.root)])
        assert code == 3, said[-2000:]
        doomed.stop()
        run_dir = tmp_path / "runs" / "deployment-dies"
        info = run_json(run_dir)
        assert info["failed_variants"] == ["spread"] and info["variant_status"]["ref"]["exit_code"] == 0, info
        error = info["variant_status"]["spread"]["error"]
        # the head's node died (its unit's actor with it), or node 1's (its node actor): either is named
        assert "the Ray actor running variant spread" in error or "node 1, data-parallel rank 1, was lost" in error, error
        assert wait_gone("deployment-dies", 60) == [], "a node's process outlived its deployment"
        spare = join(cluster.address, pair, Path(tempfile.mkdtemp(prefix="evp-spare-", dir="/tmp")), live_after=5)
        release.write_text("")
        done = evalpipe(*args, "--resume", str(run_dir), cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert run_json(run_dir)["verdict"] == "IDENTICAL"
        assert sorted(p["node"] for p in json.loads((run_dir / "spread" / "probes.json").read_text())["processes"]) == ["0", "1"]
    finally:
        for node in (doomed, steady, spare):
            if node is not None:
                node.stop()
    assert wait_gone("deployment-dies", 30) == []
    assert leftovers(cluster)["actors"] == [] and leftovers(cluster)["groups"] == []


def test_a_deployment_over_more_nodes_than_the_cluster_has_fails_before_it_starts(cluster, tmp_path):
    variants = {"ref": {}, "wide": {**_deployed(), "engine": {"tokenizer": "no-local-tokenizer", "data_parallel_size": 4},
                                    "launch": {**_deployed()["launch"], "deployment": {"nodes": 4, "headless_command": FAKE_SERVER}},
                                    "expect": {"same_path": True}}}
    path = write_config(tmp_path, "too-wide", variants, {"address": cluster.address})
    done = evalpipe("run", "gsm8k", "-c", str(path), "--limit", "2", "--run-id", "too-wide", cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    info = run_json(tmp_path / "runs" / "too-wide")
    assert info["variant_status"]["ref"]["exit_code"] == 0
    error = info["variant_status"]["wide"]["error"]
    assert "wide is a deployment over 4 nodes" in error and "3 of the 3 live node(s) can hold one" in error, error
    assert "wide" not in info.get("placements", {}), "nothing of it was placed"
    assert_nothing_left(cluster, "too-wide")


def test_the_local_cluster_runs_no_log_monitor(cluster):
    """Every driver evalpipe connects leaves Ray's log forwarding off: a log monitor per node
    would poll files for no reader, on the cores the runs need."""
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in marked_pids(cluster.root)]
    assert any(b"raylet" in c or b"ray_cli" in c or b"gcs_server" in c for c in commands), commands
    assert not [c for c in commands if b"log_monitor" in c]
