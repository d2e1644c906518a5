"""evalpipe/compare/unshard.py: captured pieces put back into the full tensor (token shards at their positions, head columns and partial sums, a tensor held at an output scale compared at scale one), and what cannot be reassembled said in a clause."""

from __future__ import annotations

import numpy as np
import pytest
from capture_pieces import full_tensor, piece

from evalpipe.compare.unshard import NotReassembled, Reassembled, reassemble


def test_token_shards_are_put_back_at_their_positions():
    x = full_tensor(6)
    pieces = [piece(x[[4, 5]], layout="token_shards", rank=1, world=2, rows=[4, 5], shard_rows=3),
              piece(x[[0, 2]], layout="token_shards", rank=0, world=2, rows=[0, 2], shard_rows=3)]
    got = reassemble(pieces)
    assert isinstance(got, Reassembled)
    assert got.rows.tolist() == [0, 2, 4, 5]
    np.testing.assert_array_equal(got.values, x[[0, 2, 4, 5]])


def test_head_columns_and_partial_sums_reassemble_the_full_tensor():
    x = full_tensor()
    cols = [[(0, 3)], [(3, 8)]]
    pieces = [piece(x[:, 0:3], layout="head_columns", rank=0, world=2, columns=cols[0]),
              piece(x[:, 3:8], layout="head_columns", rank=1, world=2, columns=cols[1])]
    got = reassemble(pieces)
    assert isinstance(got, Reassembled)
    np.testing.assert_array_equal(got.values, x)

    parts = [x * 0.25, x * 0.75]
    summed = reassemble([piece(p, layout="partial_sum", rank=r, world=2) for r, p in enumerate(parts)])
    assert isinstance(summed, Reassembled)
    np.testing.assert_allclose(summed.values, x, rtol=1e-6)


def test_a_tensor_held_at_an_output_scale_is_compared_at_scale_one():
    x = full_tensor()
    got = reassemble([piece(x * 16384, scale=16384.0)])
    assert isinstance(got, Reassembled)
    np.testing.assert_array_equal(got.values, x)
    mixed = reassemble([piece(x, layout="partial_sum", rank=0, world=2), piece(x, layout="partial_sum", rank=1, world=2, scale=2.0)])
    assert isinstance(mixed, NotReassembled) and "several scales (1, 2)" in mixed.why


@pytest.mark.parametrize(
    "pieces, why",
    [
        ([piece(full_tensor()[:, :4], layout="head_columns", rank=0, world=2, columns=[(0, 4)]),
          piece(full_tensor()[:, 3:7], layout="head_columns", rank=1, world=2, columns=[(3, 7)])], "column 3 is held by more than one rank"),
        ([piece(full_tensor()[:, :4], layout="head_columns", rank=0, world=2, columns=[(0, 4)]),
          piece(full_tensor()[:, 4:7], layout="head_columns", rank=1, world=2, columns=[(4, 7)])], "column 7 is held by no rank"),
        ([piece(full_tensor(), layout="partial_sum", rank=0, world=3)], "ranks 1, 2 of 3 wrote no piece"),
        ([piece(full_tensor(), layout="replicated", rank=0, world=2),
          piece(full_tensor(seed=1), layout="replicated", rank=1, world=2)], "rank 1's copy differs from rank 0's"),
        ([piece(full_tensor(), layout="full"), piece(full_tensor(), layout="token_shards", rank=0, world=1, shard_rows=4)],
         "several layouts"),
    ],
)
def test_what_cannot_be_reassembled_is_said(pieces, why):
    got = reassemble(pieces)
    assert isinstance(got, NotReassembled) and why in got.why, got
