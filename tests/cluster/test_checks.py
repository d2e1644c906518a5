"""`evalpipe doctor` on a real Ray cluster of three nodes on 127.0.0.1 (tests/support/ray_cluster.py):
the cluster reachable, the same versions on every node, every variant placeable, its
interpreter and model on the nodes that may run it; and each of those failing in one
sentence; an address nothing answers on fails at once."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import in_process
import yaml
from ray_cluster import leftovers


def doctor(tmp: Path, variants: dict, cluster: dict | None, *extra: str, progress: str = "terminal"):
    cfg = {"model": {"path": "builtin:tiny-gsm"}, "engine": {"max_model_len": 4096}, "output": str(tmp / "runs"),
           "variants": variants, "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]}}
    if cluster is not None:
        cfg["cluster"] = cluster
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = in_process.evalpipe("--progress", progress, "doctor", "gsm8k", "-c", str(path), *extra, cwd=tmp, env={"RAY_AUTH_MODE": "disabled"})
    return done, " ".join(done.stdout.split())


def test_a_cluster_that_can_run_the_config_passes(cluster, tmp_path):
    done, out = doctor(tmp_path, {"a": {}, "b": {"resources": {"CPU": 1, "node_b": 1}}}, {"address": cluster.address})
    assert "PASS cluster reachable" in out and "3 nodes" in out, out
    assert "PASS cluster placeable 2 unit(s) fit" in out
    assert "PASS cluster versions Ray 2.60.0" in out and "on all 3 node(s)" in out
    assert "PASS a on its nodes interpreter and model present on the 3 node(s)" in out
    assert "PASS b on its nodes interpreter and model present on the 1 node(s)" in out
    assert leftovers(cluster)["actors"] == []


def test_what_no_node_has_and_too_few_nodes_fail(cluster, tmp_path):
    ray_engine = {"engine": {"distributed_executor_backend": "ray", "tensor_parallel_size": 2}}
    done, out = doctor(tmp_path, {"a": {}, "b": {"resources": {"node_z": 1}}, "c": ray_engine}, {"address": cluster.address})
    assert done.returncode == 2
    assert "FAIL cluster placeable b asks for {node_z: 1}, which no live node has in all" in out, out
    assert ("FAIL c engine ranks its engine places its 2 rank(s) itself through Ray (distributed_executor_backend: ray), "
            "one device bundle each, but no live node has a device resource") in out, out
    assert "engine ranks" not in out.split("FAIL c engine ranks")[0], "only the Ray-placed engine is asked for ranks"
    spread = {f"v{i}": {} for i in range(4)}
    done, out = doctor(tmp_path, spread, {"address": cluster.address, "distinct_nodes": True})
    assert done.returncode == 2
    assert "4 variants (v0, v1, v2, v3) cannot each have a node of their own among 3 live node(s)" in out, out


def test_an_interpreter_missing_on_the_nodes_fails(cluster, tmp_path):
    done, out = doctor(tmp_path, {"a": {}, "b": {"python": "/opt/nowhere/bin/python"}}, {"address": cluster.address})
    assert done.returncode == 2
    assert "FAIL b on its nodes missing: /opt/nowhere/bin/python on" in out, out
    assert "PASS a on its nodes" in out


def test_an_address_where_ray_does_not_listen_fails_saying_what_listens(tmp_path):
    """The dashboard's port is the common slip: an HTTP server answers there, and the check
    says so (Ray's own attempt would retry for minutes); under --progress jsonl stdout stays
    JSON lines ending in the verdict, a record per check."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        done, _ = doctor(tmp_path, {"a": {}}, None, "--cluster", f"127.0.0.1:{port}", progress="jsonl")
    finally:
        server.shutdown()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["event"] == "verdict" and events[-1]["exit_code"] == 2, events
    # each check is a record: its line for people, its fields for machines
    (failed,) = [e for e in events if e["event"] == "record" and not e["ok"]]
    assert (failed["scope"], failed["check"]) == ("cluster", "reachable"), failed
    assert failed["detail"].startswith(f"no Ray cluster answers at 127.0.0.1:{port}: an HTTP server answers on "
                                       f"127.0.0.1:{port}, not Ray's GCS"), failed
    assert " ".join(failed["text"].split()).startswith("FAIL cluster reachable no Ray cluster answers"), failed


def test_a_deployment_needs_as_many_nodes_as_it_spans(cluster, tmp_path):
    """Three live nodes: a two-node deployment fits, a four-node one is named with what can hold it."""
    def deployed(nodes: int) -> dict:
        return {"engine": {"data_parallel_size": nodes},
                "launch": {"mode": "serve", "deployment": {"nodes": nodes}}}

    done, out = doctor(tmp_path, {"two": deployed(2), "four": deployed(4)}, {"address": cluster.address})
    assert ("FAIL cluster placeable four is a deployment over 4 nodes, each asking for {CPU: 1} on a node of its own, "
            "and 3 of the 3 live node(s) can hold one") in out, out
    assert "two is a deployment" not in out


def test_deployment_short_counts_the_nodes_that_can_hold_a_bundle():
    from evalpipe.cluster.checks import deployment_short
    from evalpipe.cluster.session import NodeCapacity

    live = [NodeCapacity(node_id=str(i), ip="127.0.0.1", hostname="h", total={"CPU": 1.0, "NPU": npu}, alive=True)
            for i, npu in enumerate((16.0, 16.0, 8.0))]
    assert deployment_short("v", {"NPU": 16.0}, 2, live) is None
    short = deployment_short("v", {"NPU": 16.0}, 3, live)
    assert short is not None and "2 of the 3 live node(s) can hold one" in short
