"""evalpipe/config/ray_engine.py: which engines place their own ranks through Ray, how many
devices they take, and the unit that would hold them."""

from __future__ import annotations

import pytest

from evalpipe.config.ray_engine import held_devices_problem, ray_placed_engine


@pytest.mark.parametrize(("args", "ranks", "chosen"), [
    ({"distributed_executor_backend": "ray", "tensor_parallel_size": 16}, 16, ("distributed_executor_backend",)),
    ({"data_parallel_backend": "ray", "tensor_parallel_size": 16, "data_parallel_size": 2}, 32, ("data_parallel_backend",)),
    ({"distributed_executor_backend": "ray", "tensor_parallel_size": 8, "pipeline_parallel_size": 2}, 16,
     ("distributed_executor_backend",)),
    ({"distributed_executor_backend": "ray", "data_parallel_backend": "ray"}, 1, ("distributed_executor_backend", "data_parallel_backend")),
])
def test_a_ray_backend_is_found_with_its_ranks(args, ranks, chosen):
    engine = ray_placed_engine(args)
    assert engine is not None and engine.ranks == ranks and engine.backend_args == chosen


@pytest.mark.parametrize("args", [{}, {"distributed_executor_backend": "mp", "tensor_parallel_size": 8},
                                  {"data_parallel_backend": "mp", "data_parallel_size": 2}])
def test_other_backends_place_nothing_through_ray(args):
    assert ray_placed_engine(args) is None
    assert held_devices_problem("v", args, {"NPU": 16}) is None


def test_a_unit_holding_devices_a_ray_engine_needs_is_one_sentence():
    args = {"data_parallel_backend": "ray", "tensor_parallel_size": 16, "data_parallel_size": 2}
    problem = held_devices_problem("sp", args, {"CPU": 8, "NPU": 16, "node_a": 1})
    assert problem is not None and problem.count(". ") == 0 and problem.endswith(".")
    assert "variant `sp`" in problem and "32 rank(s)" in problem and "{NPU: 16}" in problem and "node_a" not in problem
    assert held_devices_problem("sp", args, {"CPU": 8, "node_a": 1}) is None
    assert held_devices_problem("sp", args, {"CPU": 8, "GPU": 0}) is None, "a zero amount holds nothing"
