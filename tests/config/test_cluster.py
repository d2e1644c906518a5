"""`cluster:` of a run config (evalpipe/config/cluster.py): absent it is a local run, its
resources are a mapping of names to amounts >= 0 (refused in one sentence otherwise, for a
variant's own `resources:` too), and `distinct_nodes` cannot be limited by `concurrency`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evalpipe.config.cluster import DEFAULT_RESOURCES, ClusterSettings, check_variant_resources


def test_the_defaults_are_a_local_run_asking_one_cpu():
    local = ClusterSettings()
    assert not local.enabled and local.resources == DEFAULT_RESOURCES == {"CPU": 1.0}
    there = ClusterSettings(address="auto", resources={"NPU": 16, "CPU": 1})
    assert there.enabled and there.resources == {"NPU": 16.0, "CPU": 1.0}


@pytest.mark.parametrize("resources, fragment", [
    ({}, "give a mapping of Ray resource names to amounts"),
    ([("CPU", 1)], "give a mapping of Ray resource names to amounts"),
    ({" ": 1}, "resource name ' ' is not a name"),
    ({"NPU": -1}, "resource `NPU`: -1 is not an amount; give a number >= 0"),
    ({"NPU": True}, "resource `NPU`: True is not an amount"),
    ({"NPU": float("inf")}, "resource `NPU`: inf is not an amount"),
    ({"NPU": 0, "CPU": 0.0}, "every amount is 0, and Ray places no bundle that asks for nothing"),
])
def test_resources_that_are_no_amounts_are_refused(resources, fragment):
    with pytest.raises(ValidationError, match=fragment.replace("(", r"\(")):
        ClusterSettings(address="auto", resources=resources)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        check_variant_resources(resources)


def test_distinct_nodes_place_every_variant_at_once():
    assert ClusterSettings(address="auto", distinct_nodes=True).concurrency is None
    with pytest.raises(ValidationError, match="`concurrency` cannot limit them; remove one of the two"):
        ClusterSettings(address="auto", distinct_nodes=True, concurrency=2)
    with pytest.raises(ValidationError, match="concurrency"):
        ClusterSettings(concurrency=0)
    assert check_variant_resources(None) is None, "a variant without its own resources takes the cluster's"


@pytest.mark.parametrize("address, fragment", [
    ("", "is empty"), ("local", "private one-node Ray cluster"), ("http://10.0.0.1:6379", "the scheme http://"),
    ("ray://head", "names no port; give HOST:PORT, e.g. head:10001"), ("10.0.0.1", "e.g. 10.0.0.1:6379"),
    ("head:port", "'port', which is not a number"), ("head:0", "out of range"), ("head:65536", "out of range"),
    ("head:٣", "not a number"),
])
def test_an_address_says_what_is_wrong_with_it(address, fragment):
    with pytest.raises(ValidationError, match=fragment):
        ClusterSettings(address=address)


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "ray://head:10001", "[::1]:6379", "head.example:1"])
def test_the_forms_ray_connects_to_are_taken(address):
    assert ClusterSettings(address=address).address == address


@pytest.mark.parametrize("key, value", [("concurrency", True), ("placement_timeout_s", True), ("address", True)])
def test_a_bool_is_no_number_or_address_here_either(key, value):
    with pytest.raises(ValidationError):
        ClusterSettings(**{key: value})
