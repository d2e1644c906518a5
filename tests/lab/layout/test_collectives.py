"""The reference layout model's pieces that need no engine: the emulated collectives (pure
torch), the fault registry and how settings are resolved from the environment/config."""

from __future__ import annotations

import pytest
import torch

from evalpipe.lab.layout import collectives as C

T = 4
HEADS, HEAD_DIM, HIDDEN = 6, 8, 24


def rand(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("n,size", [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3), (3504, 876)])
def test_shard_size_is_ceil_and_padding_completes_the_batch(n, size):
    assert C.shard_size(n, T) == size
    assert C.padded_len(n, T) == size * T >= n
    assert sum(C.valid_rows(n, r * size, size) for r in range(T)) == n


def test_head_groups_split_unevenly_larger_first():
    groups = C.head_groups(6, 4)
    assert [list(g) for g in groups] == [[0, 1], [2, 3], [4], [5]]
    assert [len(g) for g in C.strided_head_groups(6, 4)] == [2, 2, 1, 1]
    assert [list(g) for g in C.strided_head_groups(6, 4)] == [[0, 4], [1, 5], [2], [3]]
    assert [list(g) for g in C.head_groups(6, 1)] == [list(range(6))]


@pytest.mark.parametrize("world", [0, 7])
def test_head_groups_need_one_head_per_rank(world):
    with pytest.raises(ValueError, match="between 1 and 6"):
        C.head_groups(6, world)


def test_head_columns_select_whole_heads():
    cols = C.head_columns(range(2, 4), HEAD_DIM)
    assert cols.tolist() == list(range(2 * HEAD_DIM, 4 * HEAD_DIM))


def test_pad_modes_and_unpad():
    x = rand(5, 3)
    zeros = C.pad_rows(x, 8)
    assert torch.equal(zeros[5:], torch.zeros(3, 3)) and torch.equal(C.unpad(zeros, 5), x)
    stale = C.pad_rows(x, 8, mode="replicate")
    assert torch.equal(stale[5:], x[-1:].expand(3, 3))
    assert C.pad_rows(x, 5) is x


def test_zero_padding_leaves_its_input_alone():
    x = rand(3, 2)
    out = C.zero_padding(x, 1)
    assert torch.equal(out[1:], torch.zeros(2, 2)) and not torch.equal(x[1:], torch.zeros(2, 2))


def test_take_shard_past_the_end_repeats_the_last_row():
    padded = rand(8, 2)
    assert torch.equal(C.take_shard(padded, 2, 2), padded[2:4])
    assert torch.equal(C.take_shard(padded, 7, 2), padded[[7, 7]])
    assert torch.equal(C.take_shard(padded, 8, 2), padded[[7, 7]])  # a whole shard past the end


def test_check_shard_accepts_every_rank_of_a_padded_batch():
    for n in (1, 5, 8, 9):
        size = C.shard_size(n, T)
        for r in range(T):
            C.check_shard(rank=r, offset=r * size, rows=size, num_tokens=n, world=T)


def test_check_shard_rejects_an_offset_off_by_one():
    with pytest.raises(C.ShardMismatch, match=r"rank 2/4 .* 9 tokens: starts at token 7, expected 2 \* 3 = 6"):
        C.check_shard(rank=2, offset=7, rows=3, num_tokens=9, world=4)


def test_check_shard_rejects_a_wrong_length():
    with pytest.raises(C.ShardMismatch, match=r"holds 2 rows, expected ceil\(9/4\) = 3"):
        C.check_shard(rank=0, offset=0, rows=2, num_tokens=9, world=4)


def test_all_gather_inverts_scatter():
    full = rand(8, 3)
    shards = C.scatter(full, T)
    assert [s.shape[0] for s in shards] == [2] * T
    assert torch.equal(C.all_gather(shards), full)


def test_all_to_all_gives_each_rank_all_tokens_of_its_heads():
    n = 7
    padded = C.pad_rows(rand(n, HEADS * HEAD_DIM), C.padded_len(n, T))
    columns = [C.head_columns(g, HEAD_DIM) for g in C.head_groups(HEADS, T)]
    received = C.all_to_all(C.split_shards(padded, T), columns)
    for cols, got in zip(columns, received):
        assert torch.equal(got, padded[:, cols])


def test_reductions_sum_in_their_documented_order():
    partials = [rand(8, 5, seed=s) for s in range(T)]
    assert torch.equal(C.reduce_rank_order(partials), ((partials[0] + partials[1]) + partials[2]) + partials[3])
    ring = C.reduce_scatter_ring(partials)
    for j in range(T):
        rows = slice(2 * j, 2 * j + 2)
        p = [partials[(j + k) % T][rows] for k in range(1, T + 1)]
        assert torch.equal(ring[j], ((p[0] + p[1]) + p[2]) + p[3])
    tree = C.all_gather(C.reduce_scatter_tree(partials))
    assert torch.equal(tree, (partials[0] + partials[1]) + (partials[2] + partials[3]))


def test_tree_reduce_carries_an_odd_rank():
    partials = [rand(3, 2, seed=s) for s in range(3)]
    assert torch.equal(C.all_gather(C.reduce_scatter_tree(partials)), (partials[0] + partials[1]) + partials[2])


def test_summation_orders_agree_to_rounding_but_not_bitwise():
    partials = [rand(64, 96, seed=s) for s in range(T)]
    exact = sum(p.double() for p in partials)
    legacy = C.reduce_rank_order(partials)
    ring = C.all_gather(C.reduce_scatter_ring(partials))
    assert torch.allclose(legacy.double(), exact, atol=1e-5) and torch.allclose(ring.double(), exact, atol=1e-5)
    assert not torch.equal(legacy, ring)  # the layout change is visible in the last bits
    assert torch.equal(C.split_shards(ring, T)[T - 1], C.split_shards(legacy, T)[T - 1])  # shard T-1 starts at rank 0


def test_accumulator_dtype():
    partials = [rand(8, 16, seed=s) for s in range(T)]
    exact = sum(p.double() for p in partials)
    wide = C.all_gather(C.reduce_scatter_ring(partials, acc_dtype=torch.float64))
    narrow = C.all_gather(C.reduce_scatter_ring(partials, acc_dtype=torch.bfloat16))
    assert wide.dtype == torch.float64 and narrow.dtype == torch.bfloat16
    assert (wide - exact).abs().max() < 1e-12
    assert (narrow.double() - exact).abs().max() > 1e-3  # 8-bit mantissa


def test_fp16_accumulator_overflows_when_scaled_after():
    partials = [torch.full((4, 2), 2.0) for _ in range(T)]  # sum 8.0
    after = torch.cat(C.reduce_scatter_ring(partials, acc_dtype=torch.float16)) * 16384.0
    before = C.all_gather(C.reduce_scatter_ring([p * 16384.0 for p in partials]))
    assert torch.isinf(after).all() and torch.equal(before, torch.full((4, 2), 8.0 * 16384))


def test_all_reduce_then_reduce_scatter_counts_twice():
    partials = [rand(8, 4, seed=s) for s in range(T)]
    once = C.all_gather(C.reduce_scatter_ring(partials))
    twice = C.all_gather(C.reduce_scatter_ring(C.all_reduce(partials)))
    assert torch.allclose(twice, T * once, atol=1e-5)


def test_fold_into_batch_is_exact_for_zero_padding_and_leaks_stale_rows():
    n = 5
    x = rand(n, 3)
    size = C.shard_size(n, T)
    zeroed = C.all_gather([C.zero_padding(C.take_shard(C.pad_rows(x, size * T, "replicate"), r * size, size),
                                          C.valid_rows(n, r * size, size)) for r in range(T)])
    assert torch.equal(C.fold_into_batch(zeroed, n), x)
    stale = C.pad_rows(x, size * T, mode="replicate")  # 3 padding rows, copies of the last
    leaked = C.fold_into_batch(stale, n)
    assert torch.equal(leaked[:-1], x[:-1]) and torch.allclose(leaked[-1], 4 * x[-1])


def test_legacy_and_sp_layouts_compute_the_same_o_projection():
    """The two layouts of the O projection around a given attention output, end to end."""
    n = 11
    size, world = C.shard_size(n, T), T
    attn = rand(n, HEADS * HEAD_DIM, seed=1)
    w_o = rand(HIDDEN, HEADS * HEAD_DIM, seed=2)
    columns = [C.head_columns(g, HEAD_DIM) for g in C.head_groups(HEADS, world)]
    exact = attn.double() @ w_o.double().T

    partials = [attn[:, c] @ w_o[:, c].T for c in columns]
    legacy = C.unpad(C.all_gather(C.scatter(C.pad_rows(C.reduce_rank_order(partials), size * world), world)), n)

    received = C.all_to_all(C.split_shards(C.pad_rows(attn, size * world), world), columns)
    sp = C.unpad(C.all_gather(C.reduce_scatter_ring([r @ w_o[:, c].T for r, c in zip(received, columns)])), n)

    assert torch.allclose(legacy.double(), exact, atol=1e-5) and torch.allclose(sp.double(), exact, atol=1e-5)
    assert not torch.equal(legacy, sp)


def test_random_order_reduction_sums_every_rank_in_an_order_drawn_per_row():
    torch.manual_seed(0)
    partials = [torch.randn(64, 8, dtype=torch.bfloat16) for _ in range(4)]
    exact = torch.stack([p.double() for p in partials]).sum(0)
    a = C.reduce_random_order(partials, torch.Generator().manual_seed(1))
    b = C.reduce_random_order(partials, torch.Generator().manual_seed(2))
    assert a.dtype == torch.bfloat16 and a.shape == (64, 8)
    assert torch.allclose(a.double(), exact, rtol=0.05, atol=0.05)
    assert torch.equal(a, C.reduce_random_order(partials, torch.Generator().manual_seed(1))), "the generator decides"
    differs = (a != b).any(dim=1)
    assert 0 < int(differs.sum()) < 64, "some rows summed in another order, not all in the same one"
