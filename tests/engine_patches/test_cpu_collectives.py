"""evalpipe/engine_patches/cpu_collectives.py: the uneven all-gather and reduce-scatter vLLM's CPU communicator lacks, on real gloo ranks, and sizes that do not fit refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from evalpipe.engine_patches import cpu_collectives


def _rank_main(rank: int, world: int, port: int, results) -> None:  # noqa: ANN001
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    comm = SimpleNamespace(world_size=world, rank_in_group=rank, device_group=dist.group.WORLD)
    sizes = [3, 1, 0, 2][:world]
    mine = torch.arange(sizes[rank] * 4, dtype=torch.float32).reshape(sizes[rank], 4) + 100 * rank
    gathered = cpu_collectives.all_gatherv(comm, [mine, mine[:, :1].to(torch.int64)], dim=0, sizes=sizes)
    full = torch.arange(sum(sizes) * 2, dtype=torch.float64).reshape(2, sum(sizes)) * (rank + 1)
    scattered = cpu_collectives.reduce_scatterv(comm, full, dim=1, sizes=sizes)
    even = cpu_collectives.all_gatherv(comm, mine[:1] if sizes[rank] else torch.zeros(1, 4), dim=0)
    results[rank] = (gathered[0], gathered[1], scattered, even)
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uneven_all_gather_and_reduce_scatter_on_real_gloo_ranks():
    world, sizes = 4, [3, 1, 0, 2]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(world, _free_port(), results), nprocs=world, join=True)
        results = dict(results)
    pieces = [torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + 100 * r for r, n in enumerate(sizes)]
    whole = torch.cat(pieces)
    total = torch.arange(sum(sizes) * 2, dtype=torch.float64).reshape(2, sum(sizes)) * sum(range(1, world + 1))
    starts = [sum(sizes[:r]) for r in range(world)]
    for rank in range(world):
        gathered, ids, scattered, even = results[rank]
        assert torch.equal(gathered, whole)  # every rank: every rank's rows, in rank order, no padding
        assert ids.dtype == torch.int64 and torch.equal(ids, whole[:, :1].to(torch.int64))
        assert torch.equal(scattered, total[:, starts[rank]:starts[rank] + sizes[rank]])  # sum kept along dim 1
        assert even.shape == (world, 4)


def test_collectives_refuse_sizes_that_do_not_fit():
    comm = SimpleNamespace(world_size=2, rank_in_group=0, device_group=None)
    with pytest.raises(ValueError, match="this rank holds 2 rows, sizes say 1"):
        cpu_collectives.all_gatherv(comm, torch.zeros(2, 3), sizes=[1, 1])
    with pytest.raises(ValueError, match="sizes sum to 3, the tensor has 4 rows"):
        cpu_collectives.reduce_scatterv(comm, torch.zeros(4, 3), dim=0, sizes=[1, 2])
