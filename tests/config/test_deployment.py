"""`launch.deployment:` (evalpipe/config/deployment.py): the shape of an engine over several
nodes is checked before anything starts, each refusal one sentence; the node layout and the
flags each node adds are derived from the engine's own data-parallel size."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evalpipe.config.deployment import Deployment, deployment_problem, node_flags, node_layout
from evalpipe.config.run_config import Launch


def test_the_even_split_puts_the_head_first_with_the_lowest_ranks():
    roles = node_layout(Deployment(nodes=2), {"data_parallel_size": 4})
    assert [(r.index, r.start_rank, r.local_ranks, r.head) for r in roles] == [(0, 0, 2, True), (1, 2, 2, False)]
    assert roles[0].label == "node 0 (head)" and roles[1].describe_ranks() == "ranks 2-3"


def test_uneven_ranks_per_node_and_launchers_follow_the_list():
    deployment = Deployment(nodes=3, ranks_per_node=[1, 2, 1], launchers=[[], ["ssh", "b"], ["ssh", "c"]])
    assert deployment_problem(deployment, {"data_parallel_size": 4}) is None
    roles = node_layout(deployment, {"data_parallel_size": 4})
    assert [(r.start_rank, r.local_ranks, r.launcher) for r in roles] == [(0, 1, ()), (1, 2, ("ssh", "b")), (3, 1, ("ssh", "c"))]


def test_a_node_s_flags_are_the_nightly_s():
    head, other = node_layout(Deployment(nodes=2), {"data_parallel_size": 2})
    assert node_flags(head, 2, "10.0.0.1", 13389) == {
        "data-parallel-size": 2, "data-parallel-size-local": 1,
        "data-parallel-address": "10.0.0.1", "data-parallel-rpc-port": 13389}  # no start rank: see node_flags
    assert node_flags(other, 2, "10.0.0.1", 13389)["headless"] is True
    assert node_flags(other, 2, "10.0.0.1", 13389)["data-parallel-start-rank"] == 1


@pytest.mark.parametrize("fields, fragment", [
    ({"nodes": 0}, "greater than or equal to 1"),
    ({"nodes": True}, "where a number is wanted"),
    ({"nodes": 2, "ranks_per_node": 0}, "every node runs at least one data-parallel rank"),
    ({"nodes": 2, "ranks_per_node": []}, "an empty list"),
    ({"nodes": 2, "ranks_per_node": [1, 1, 1]}, "lists 3 node(s) for `nodes: 2`"),
    ({"nodes": 2, "launchers": [[]]}, "`launchers` has 1 prefix(es) for `nodes: 2`"),
    ({"nodes": 2, "launchers": [[], ["ssh", ""]]}, "node 1's launcher"),
    ({"nodes": 2, "rpc_port": 70000}, "less than or equal to 65535"),
    ({"nodes": 2, "address": ""}, "at least 1 character"),
    ({"nodes": 2, "node": 1}, "Extra inputs are not permitted"),
])
def test_shapes_that_cannot_be_are_refused(fields, fragment):
    with pytest.raises(ValidationError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Deployment.model_validate(fields)


@pytest.mark.parametrize("deployment, args, fragment", [
    (Deployment(nodes=2), {"data_parallel_size": 3}, "data_parallel_size 3 does not split evenly over 2 nodes"),
    (Deployment(nodes=2), {}, "data_parallel_size 1 does not split evenly over 2 nodes"),
    (Deployment(nodes=2, ranks_per_node=[1, 2]), {"data_parallel_size": 2}, "adds up to 3 ranks, and data_parallel_size is 2"),
    (Deployment(nodes=2, ranks_per_node=2), {"data_parallel_size": 2}, "adds up to 4 ranks"),
    (Deployment(nodes=2), {"data_parallel_size": 2, "data_parallel_size_local": 1}, "`data_parallel_size_local` is what"),
    (Deployment(nodes=2), {"data_parallel_size": 2, "headless": True}, "`headless` is what"),
    (Deployment(nodes=2), {"data_parallel_size": 2, "data_parallel_backend": "ray"}, "places the ranks itself"),
])
def test_engine_arguments_that_contradict_the_deployment_are_named(deployment, args, fragment):
    problem = deployment_problem(deployment, args)
    assert problem is not None and fragment in problem


def test_a_deployment_is_for_serve_mode_and_names_its_launchers_itself():
    with pytest.raises(ValidationError, match="needs mode `serve` \\(not `offline`\\)"):
        Launch(deployment={"nodes": 2})
    with pytest.raises(ValidationError, match="give each node its prefix in `deployment.launchers`"):
        Launch(mode="serve", launcher=["ssh", "a"], deployment={"nodes": 2})
    assert Launch(mode="serve", deployment={"nodes": 2}).deployment == Deployment(nodes=2)


def test_ssh_hands_its_words_to_a_shell_and_other_launchers_do_not():
    from evalpipe.config.deployment import hands_to_shell

    auto = Deployment(nodes=2)
    assert hands_to_shell(auto, ("ssh", "b")) and hands_to_shell(auto, ("/usr/bin/ssh", "-tt", "b"))
    assert not hands_to_shell(auto, ("kubectl", "exec", "pod", "--")) and not hands_to_shell(auto, ())
    assert not hands_to_shell(Deployment(nodes=2, remote_shell=False), ("ssh", "b"))
    assert hands_to_shell(Deployment(nodes=2, remote_shell=True), ("docker", "exec", "c", "sh", "-c"))


def test_a_head_behind_a_launcher_has_its_ports_fixed():
    remote_head = {"nodes": 2, "launchers": [["ssh", "a"], ["ssh", "b"]]}
    with pytest.raises(ValidationError, match="a head started through a launcher needs its ports fixed"):
        Launch(mode="serve", deployment=remote_head)
    with pytest.raises(ValidationError, match="needs its ports fixed"):
        Launch(mode="serve", port=8000, deployment=remote_head)
    assert Launch(mode="serve", port=8000, deployment={**remote_head, "rpc_port": 13389}).port == 8000
    assert Launch(mode="serve", deployment={"nodes": 2, "launchers": [[], ["ssh", "b"]]}).port is None  # the head is here
