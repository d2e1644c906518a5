"""The Ascend profiles whose engines are deployments evalpipe launches (launch.deployment),
by `evalpipe run --dry-run`: each node's command line, read back with shlex, says the
two-node layout of vllm-ascend's GLM-5 nightly (tests/e2e/nightly/multi_node/config/
GLM5_1-W8A8-A3-dual-nodes.yaml): DP2 x TP16 + EP over two A3 nodes, node 0 serving HTTP,
node 1 headless with start rank 1, both meeting at the head's address and RPC port."""

from __future__ import annotations

import re
import shlex
from typing import Any

from in_process import evalpipe

from evalpipe.config.loading import load_config
from evalpipe.install import default_config

PROFILES = default_config().parent / "ascend"
LAUNCHED = PROFILES / "glm5-dsa-two-nodes-launched.yaml"
RAY = PROFILES / "glm5-dsa-cluster-ray.yaml"
ENGINES = ("legacy", "legacy-aa", "sp")

# The flags a node's line adds to the engine's: its data-parallel place, and the layout itself.
LAYOUT_FLAGS = ("--data-parallel-", "--tensor-parallel-size", "--pipeline-parallel-size", "--enable-expert-parallel",
                "--headless", "--api-server-count", "--distributed-executor-backend")


def node_lines(stdout: str) -> dict[str, list[str]]:
    """Each variant's node command lines as the dry run prints them, node 0's first."""
    found: dict[str, list[str]] = {}
    variant, expect_command = None, False
    for line in stdout.splitlines():
        if (started := re.match(r"^(\S+) \((?:serve|offline|endpoint)\) runs:$", line)) is not None:
            variant = started.group(1)
            found[variant] = []
        elif re.match(r"^\s+node (\d+)( \(head\))?, data-parallel rank", line) is not None:
            expect_command = True
        elif expect_command:
            assert variant is not None, line
            found[variant].append(line.strip())
            expect_command = False
    return found


def flags_of(argv: list[str]) -> dict[str, Any]:
    """The `--flag value` / `--flag` words of a node's command line, from `--model` on
    (before it: the launcher, `env K=V ...` and the command)."""
    words = argv[argv.index("--model"):]
    flags: dict[str, Any] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            assert word not in flags, f"{word} said twice: {argv}"
            flags[word] = value
    return flags


def layout(flags: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flags.items() if k.startswith(LAYOUT_FLAGS)}


def nightly(address: str, node: int) -> dict[str, Any]:
    """The nightly's data-parallel and tensor-parallel flags of ``node`` (its --seed too), less the
    `--data-parallel-start-rank 0` its head passes and evalpipe's does not (vLLM 0.32 reads any
    start rank on a node that is not headless as hybrid load balancing)."""
    flags: dict[str, Any] = {"--data-parallel-size": "2", "--tensor-parallel-size": "16",
                             "--data-parallel-rpc-port": "13389", "--data-parallel-size-local": "1",
                             "--data-parallel-address": address, "--enable-expert-parallel": True, "--seed": "1024"}
    if node:
        flags |= {"--headless": True, "--data-parallel-start-rank": str(node)}
    return flags


def test_the_launched_profile_starts_each_engine_on_two_pods_as_the_nightly_does(tmp_path):
    config = load_config(LAUNCHED)
    legacy = config.variant_launch("legacy").deployment
    sp = config.variant_launch("sp").deployment
    aa = config.noise_floor.launch["deployment"]
    assert legacy is not None and sp is not None and legacy.nodes == sp.nodes == 2 and legacy.rpc_port == 13389
    planned = {"legacy": (legacy.address, legacy.launchers), "sp": (sp.address, sp.launchers),
               "legacy-aa": (aa["address"], aa["launchers"])}
    pods = {name: [launcher[2] for launcher in launchers] for name, (_, launchers) in planned.items()}
    assert len({pod for pair in pods.values() for pod in pair}) == 6, f"three engines, six pods of their own: {pods}"
    assert set(pods["legacy-aa"]).isdisjoint(pods["legacy"]), "the A/A run on nodes of its own"

    proc = evalpipe("run", "gsm8k", "-c", str(LAUNCHED), "--dry-run", "--output", str(tmp_path), cwd=tmp_path)
    lines = node_lines(proc.stdout)
    assert set(lines) == set(ENGINES), proc.stdout[-3000:]
    for name in ENGINES:
        address, launchers = planned[name]
        assert len(lines[name]) == 2, (name, lines[name])
        argvs = [shlex.split(line) for line in lines[name]]
        for node, (argv, launcher) in enumerate(zip(argvs, launchers)):
            assert launcher == ["kubectl", "exec", pods[name][node], "--"] and argv[:4] == launcher, (name, node, argv[:4])
            assert argv[4] == "env" and f"EVALPIPE_NODE={node}" in argv[:argv.index("--model")], (name, node)
            flags = flags_of(argv)
            want = nightly(address, node)
            assert {k: flags.get(k) for k in want} == want, (name, node, flags)
            assert layout(flags) == layout(want), (name, node, "no other data-parallel or layout flag")
        head, headless = (flags_of(argv) for argv in argvs)
        assert "vllm.entrypoints.openai.api_server" in argvs[0] and "evalpipe.worker.headless" in argvs[1]
        assert head["--host"] == "0.0.0.0" and head["--port"] == "8000" and "--host" not in headless and "--port" not in headless
        shared = {k: v for k, v in head.items() if k not in ("--host", "--port")}
        assert shared == {k: v for k, v in headless.items() if k not in ("--headless", "--data-parallel-start-rank")}, name
        assert f"talks to the head at http://{address}:8000" in proc.stdout
    assert "max-num-seqs 6" in lines["legacy-aa"][0] and "max-num-seqs 12" in lines["legacy"][0]  # the A/A run's own batch
    # then the plan is checked against this machine: one sentence, exit 2, nothing written
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_ray_profile_places_each_engine_on_two_nodes_of_its_own(tmp_path):
    config = load_config(RAY)
    deployment = config.launch.deployment
    assert deployment is not None and deployment.nodes == 2 and deployment.launchers is None, "Ray places the nodes"
    assert "data_parallel_backend" not in config.engine and config.engine["tensor_parallel_size"] == 16
    assert config.cluster.resources == {"NPU": 16.0, "CPU": 8.0} and config.cluster.concurrency == 3
    assert config.variant_expect("sp").deployment is not None and config.variant_expect("sp").deployment.nodes == 2

    proc = evalpipe("run", "gsm8k", "-c", str(RAY), "--dry-run", "--output", str(tmp_path), cwd=tmp_path)
    lines = node_lines(proc.stdout)
    assert set(lines) == set(ENGINES), proc.stdout[-3000:]
    for name in ENGINES:
        assert len(lines[name]) == 2, (name, lines[name])
        argvs = [shlex.split(line) for line in lines[name]]
        assert not any("kubectl" in argv for argv in argvs), "no launcher: Ray starts each node's process"
        head, headless = (flags_of(argv) for argv in argvs)
        address = head["--data-parallel-address"]
        for node, flags in enumerate((head, headless)):
            want = nightly(address, node)
            want["--data-parallel-rpc-port"] = flags["--data-parallel-rpc-port"]  # chosen at start
            assert {k: flags.get(k) for k in want} == want and layout(flags) == layout(want), (name, node, flags)
        assert headless["--data-parallel-address"] == address and headless["--data-parallel-rpc-port"] == head["--data-parallel-rpc-port"]
    out = " ".join(proc.stdout.split())
    for name in ENGINES:
        asks = re.search(rf"\b{re.escape(name)} asks for ([^\n]*?)(?= (?:legacy|legacy-aa|sp) asks for | what the path|$)", out)
        assert asks is not None and "CPU: 8, NPU: 16" in asks.group(1), (name, out[-2000:])
    assert "data_parallel_backend" not in out and "places its" not in out, "no engine places its own ranks through Ray"
    assert proc.returncode == 2 and "does not exist" in proc.stderr  # the model: on the A3 nodes, not here
    assert list(tmp_path.iterdir()) == []
