"""`evalpipe localize`'s pure parts: capture files, un-sharding, the per-module comparison
against the A/A floor, the choice of sequences and positions. No engine (the end-to-end
tests run the real one)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from capture_pieces import WIDTH, full_tensor, piece

from evalpipe.compare.localize import Boundaries, Side, boundary_flags, format_positions, localize
from evalpipe.compare.unshard import NotReassembled, Reassembled, reassemble
from evalpipe.documents.captures import CapturedPiece, read_captures
from evalpipe.errors import UserError
from evalpipe.probes.capture import TensorCapture


def _model(fault_layer=None, fault_module="attn.out", scale=1e-2, noise=0.0, seed=0):
    """Pieces of a 3-layer model's capture points; a relative error ``scale`` injected at
    (fault_layer, fault_module) and carried into every later module."""
    rng = np.random.default_rng(seed)
    out, hit = [], False
    for layer in range(3):
        for module in ("attn.in", "attn.heads", "attn.out", "layer.out"):
            x = np.random.default_rng(100 * layer + len(module)).normal(size=(4, WIDTH)).astype(np.float32)
            hit = hit or (layer, module) == (fault_layer, fault_module)
            if hit:
                x = x * (1 + scale)
            if noise:
                x = x + rng.normal(scale=noise, size=x.shape).astype(np.float32) * np.abs(x)
            out.append(piece(x, module=module, layer=layer, rows=[3, 7, 8, 9], tokens=12))
    return out


def test_the_first_module_above_the_floor_is_the_fault_s():
    result = localize(Side("legacy", _model()), Side("sp", _model(1, "attn.out")), Side("legacy-aa", _model()),
                      labels={0: "t doc 0"}, tokens={0: 12}, numerics_floor=1e-5)
    first = result.first
    assert first is not None and (first.layer, first.module) == (1, "attn.out")
    assert first.rel_l2 == pytest.approx(1e-2, rel=1e-3) and first.floor == 1e-5 and result.aa_identical is True
    assert [m.above for m in result.modules[:5]] == [False] * 5  # layer 0 and layer 1 before attn.out
    sentence = result.sentence()
    assert sentence.startswith("first difference above the A/A floor: layer 1, attention output after the reduction")
    curve = result.layer_curve()
    assert [p.layer for p in curve] == [0, 1, 2] and curve[0].rel_l2 == 0 and curve[2].rel_l2 == pytest.approx(1e-2, rel=1e-3)


def test_a_noisy_a_a_raises_the_floor_and_nothing_is_localized():
    noisy = dict(noise=1e-3)
    result = localize(Side("legacy", _model()), Side("sp", _model(**noisy, seed=1)), Side("legacy-aa", _model(**noisy, seed=2)),
                      labels={}, tokens={0: 12}, numerics_floor=1e-5)
    assert result.aa_identical is False and result.first is None
    assert all(m.floor > 1e-4 for m in result.modules)
    assert result.sentence().startswith("no module above the A/A floor: 12 module outputs compared")


def test_without_an_a_a_run_the_numerics_floor_alone_applies():
    result = localize(Side("legacy", _model()), Side("sp", _model(0, "attn.heads", scale=1e-3)), None,
                      labels={}, tokens={0: 12}, numerics_floor=1e-5)
    assert result.aa is None and result.aa_identical is None
    assert result.first is not None and (result.first.layer, result.first.module) == (0, "attn.heads")
    assert "above the numerics floor" in result.sentence()


def test_a_module_one_side_cannot_reassemble_is_named():
    broken = [p for p in _model(1, "attn.out") if (p.entry.layer, p.entry.module) != (2, "attn.heads")]
    broken.append(piece(full_tensor()[:, :4], module="attn.heads", layer=2, layout="head_columns", rank=0, world=2,
                        columns=[(0, 4)], rows=[3, 7, 8, 9]))
    result = localize(Side("legacy", _model()), Side("sp", broken), None, labels={}, tokens={0: 12}, numerics_floor=1e-5)
    assert result.not_reassembled() == ["attn.heads of layer 2: sp: rank 1 of 2 wrote no piece"]


def test_boundary_flags_come_from_the_recorded_layouts():
    recorded = {(0, 10, 4, 3)}  # 10 tokens on 4 ranks: shards of 3 rows, padding after token 9
    assert boundary_flags(2, recorded, 10, Boundaries()) == ("a shard boundary of T = 4",)
    assert boundary_flags(3, recorded, 10, Boundaries()) == ("a shard boundary of T = 4",)
    assert boundary_flags(4, recorded, 10, Boundaries()) == ()
    assert boundary_flags(9, recorded, 10, Boundaries()) == ("a shard boundary of T = 4", "the last token before the padding of T = 4")
    # configured sizes only where no layout was recorded; a later prefill chunk's first token
    assert boundary_flags(7, set(), 16, Boundaries(tp_sizes=(2,))) == ("a shard boundary of T = 2",)
    assert boundary_flags(7, recorded, 16, Boundaries(tp_sizes=(2,))) == ()
    assert boundary_flags(8, {(8, 8, 1, 8)}, 16, Boundaries()) == ("the first token of a prefill chunk",)
    # a decode step on 2 ranks: its one token, then the padding row of rank 1's shard
    assert boundary_flags(8, {(8, 1, 2, 1)}, 16, Boundaries()) == (
        "a one-token forward pass (a decode step)", "the last token before the padding of T = 2")
    assert boundary_flags(2047, set(), 4096, Boundaries(sparse_block=2048)) == ("a sparse-block boundary (2048)",)


def test_positions_are_written_as_runs():
    assert format_positions([2049, 2047, 2048, 12]) == "12, 2047–2049"


def test_capture_points_keep_the_watched_rows_of_a_recognised_forward(tmp_path):
    tokens = list(range(100, 112))
    capture = TensorCapture({"dir": str(tmp_path), "sequences": [{"label": "t doc 0", "token_ids": tokens, "rows": [1, 5, 9]}]})
    x = torch.arange(12 * WIDTH, dtype=torch.float32).reshape(12, WIDTH)
    # a batch of two sequences, and a piece of another sequence: not watched
    capture.forward_started(torch.tensor(tokens[:6] + tokens[:6]), torch.tensor(list(range(6)) * 2))
    assert capture.current() is None
    capture.forward_started(torch.tensor([1, 2, 3]), torch.arange(3))
    assert capture.current() is None
    # a chunk that does not continue a captured piece: its earlier positions are not known
    capture.forward_started(torch.tensor(tokens[4:]), torch.arange(4, 12))
    assert capture.current() is None
    # a chunked prefill: positions 0..3, then 4..11
    capture.forward_started(torch.tensor(tokens[:4]), torch.arange(4))
    capture.forward_finished()
    capture.forward_started(torch.tensor(tokens[4:]), torch.arange(4, 12))
    fwd = capture.current()
    assert fwd is not None and (fwd.start, fwd.tokens, fwd.rows) == (4, 8, [5, 9])
    capture.capture("attn.out", 0, [x[4:]], "full")
    shards = list(x[4:].chunk(2))  # 8 rows on 2 ranks
    capture.capture("attn.in", 0, shards, "token_shards", world=2, shard_rows=4)
    capture.forward_finished()
    capture.capture("attn.out", 1, [x], "full")  # outside a watched forward: nothing
    pieces = read_captures(tmp_path)
    assert [(p.entry.module, p.entry.rank, p.entry.rows) for p in pieces] == [("attn.out", None, [5, 9]), ("attn.in", 0, [5]),
                                                                           ("attn.in", 1, [9])]
    np.testing.assert_array_equal(pieces[0].values, x[[5, 9]].numpy())
    got = reassemble(pieces[1:])
    assert isinstance(got, Reassembled) and got.rows.tolist() == [5, 9]
    np.testing.assert_array_equal(got.values, x[[5, 9]].numpy())


def test_a_damaged_capture_is_one_sentence(tmp_path):
    capture = TensorCapture({"dir": str(tmp_path), "sequences": [{"label": "s", "token_ids": [1, 2], "rows": [0, 1]}]})
    capture.forward_started(torch.tensor([1, 2]), torch.arange(2))
    capture.capture("attn.out", 0, [torch.ones(2, WIDTH)], "full")
    index = next(tmp_path.glob("*.jsonl"))
    index.with_suffix(".bin").write_bytes(b"\0" * 8)
    with pytest.raises(UserError, match="points past the end"):
        read_captures(tmp_path)
    line = json.loads(index.read_text())
    index.write_text(json.dumps({**line, "version": 9}) + "\n")
    with pytest.raises(UserError, match="capture of version 9; this evalpipe reads version 1"):
        read_captures(tmp_path)


class _Attention(torch.nn.Module):
    """A rank's attention: its heads into o_proj, then (as the all-reduce would) every rank's sum."""

    def __init__(self, heads_out: torch.Tensor, reduced: torch.Tensor):
        super().__init__()
        self.heads_out = heads_out  # this rank's heads' attention output, [tokens, width / T]
        self.reduced = reduced
        self.o_proj = torch.nn.Identity()

    def forward(self, x):
        self.o_proj(self.heads_out[: x.shape[0]])
        return self.reduced[: x.shape[0]]


class _Layer(torch.nn.Module):
    def __init__(self, heads_out: torch.Tensor, reduced: torch.Tensor):
        super().__init__()
        self.self_attn = _Attention(heads_out, reduced)
        self.mlp = torch.nn.Identity()

    def forward(self, x, residual):
        attn = self.self_attn(x)
        return self.mlp(attn), x + residual


class _Model(torch.nn.Module):
    def __init__(self, heads_out: torch.Tensor, reduced: torch.Tensor):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(heads_out, reduced)])

    def forward(self, x):
        return self.layers[0](x, torch.zeros_like(x))


def test_generic_hooks_on_two_tensor_parallel_ranks_put_the_heads_back_together(tmp_path):
    """Each rank's process hooks its own model: the o_proj input is its half of the heads
    (head columns), the layer's and the MLP's outputs are replicated and must agree."""
    tokens = list(range(50, 56))
    spec = {"dir": str(tmp_path), "sequences": [{"label": "s", "token_ids": tokens, "rows": [0, 3, 5]}]}
    full, reduced, x = torch.randn(6, WIDTH), torch.randn(6, WIDTH), torch.randn(6, WIDTH)
    for rank in range(2):
        capture = TensorCapture(spec)
        capture.pid = 1000 + rank  # one process per rank
        model = _Model(full[:, rank * WIDTH // 2:(rank + 1) * WIDTH // 2], reduced)
        assert capture.hook_model(model, tp_rank=rank, tp_size=2) == []
        capture.forward_started(torch.tensor(tokens), torch.arange(6))
        model(x)
        capture.forward_finished()
    pieces = read_captures(tmp_path)
    heads = reassemble([p for p in pieces if p.entry.module == "attn.heads"])
    assert isinstance(heads, Reassembled) and heads.rows.tolist() == [0, 3, 5]
    np.testing.assert_array_equal(heads.values, full[[0, 3, 5]].numpy())
    assert {p.entry.layout for p in pieces if p.entry.module != "attn.heads"} == {"replicated"}
    assert {p.entry.module for p in pieces} == {"attn.heads", "attn.out", "mlp.out", "layer.out"}
    attn = reassemble([p for p in pieces if p.entry.module == "attn.out"])
    assert isinstance(attn, Reassembled) and len({p.entry.rank for p in pieces if p.entry.module == "attn.out"}) == 2
    np.testing.assert_array_equal(attn.values, reduced[[0, 3, 5]].numpy())
    stream = reassemble([p for p in pieces if p.entry.module == "layer.out"])
    assert isinstance(stream, Reassembled)
    np.testing.assert_allclose(stream.values, (reduced + x)[[0, 3, 5]].numpy(), rtol=1e-6)


@pytest.mark.parametrize("written, when", [("localize: off", "off"), ("localize: auto", "auto"), ("localize: on", "auto"),
                                           ("localize: {when: auto, samples: 2}", "auto")])
def test_the_config_s_localize_word(tmp_path, written, when):
    from evalpipe.config.loading import load_config
    from evalpipe.install import default_config

    path = tmp_path / "c.yaml"
    path.write_text(f"extends: {default_config()}\n{written}\n")
    assert load_config(path).localize.when == when


def test_a_bad_localize_value_is_one_sentence(tmp_path):
    from evalpipe.config.errors import ConfigError
    from evalpipe.config.loading import load_config
    from evalpipe.install import default_config

    path = tmp_path / "c.yaml"
    path.write_text(f"extends: {default_config()}\nlocalize: sometimes\n")
    with pytest.raises(ConfigError, match="localize"):
        load_config(path)


def test_nan_or_inf_where_the_reference_is_finite_is_above_any_floor():
    """An overflow (the zoo's scale_after_reduce) turns rows into inf / NaN: never a "no
    difference" by way of a NaN comparison."""
    ref = _model()
    broken = _model()
    values = broken[6].values.copy()  # layer 1, attn.out
    values[1, 2], values[2, :] = np.inf, np.nan
    broken[6] = CapturedPiece(broken[6].entry, values)
    result = localize(Side("legacy", ref), Side("sp", broken), None, labels={0: "t doc 0"}, tokens={0: 12},
                      numerics_floor=1e-5)
    first = result.first
    assert first is not None and (first.layer, first.module, first.nonfinite) == (1, "attn.out", 2)
    assert first.rel_l2 == 0  # the rows both sides hold finite are equal
    assert "NaN or inf at 2 positions where the reference is finite" in result.sentence()
    assert first.above and {w.position for w in first.worst if w.rel_l2 is None} == {7, 8}


def test_an_sp_moe_layers_outputs_are_captured_as_shards_even_for_one_token(tmp_path):
    """A one-token forward's TP shard has one row on each rank, the second a padding row: the
    layer's flag, not the row count, says it is a shard, so only rank 0's row is kept."""
    tokens = [7, 8, 9]
    hidden = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    for rank in range(2):
        capture = TensorCapture({"dir": str(tmp_path), "sequences": [{"label": "s", "token_ids": tokens, "rows": [2]}]})
        capture.pid = 1000 + rank
        layers = torch.nn.ModuleList([torch.nn.Module()])
        layer = layers[0]
        layer.use_sequence_parallel_moe = True
        layer.self_attn = torch.nn.Linear(4, 4, bias=False)
        layer.self_attn.o_proj = torch.nn.Identity()
        layer.mlp = torch.nn.Identity()
        model = torch.nn.Module()
        model.layers = layers
        assert capture.hook_model(model, tp_rank=rank, tp_size=2) == []
        capture.forward_started(torch.tensor([7, 8]), torch.arange(2))  # the prompt (row 2 not in it)
        capture.forward_finished()
        capture.forward_started(torch.tensor([9]), torch.tensor([2]))  # a decode step at position 2
        shard = hidden if rank == 0 else torch.zeros(1, 4)  # rank 1 holds the padding row
        layer.mlp(shard)
        partial = hidden * (rank + 1)
        for hook in layer.self_attn._forward_hooks.values():
            hook(layer.self_attn, (hidden,), partial)
        capture.forward_finished()
    pieces = read_captures(tmp_path)
    by_module = {}
    for p in pieces:
        by_module.setdefault(p.entry.module, []).append(p)
    mlp = by_module["mlp.out"]
    assert [(p.entry.layout, p.entry.rank, p.entry.rows) for p in mlp] == [("token_shards", 0, [2])]
    np.testing.assert_array_equal(reassemble(mlp).values, hidden.numpy())
    attn = reassemble(by_module["attn.out"])
    assert isinstance(attn, Reassembled)
    np.testing.assert_array_equal(attn.values, (hidden * 3).numpy())  # the ranks' partial sums added


def test_the_forward_passes_of_a_sequence_are_reassembled_each_then_joined():
    """A prefill and two decode steps of one sequence on 2 replicated ranks (and a decode step
    seen twice): every row once, each from its own forward pass."""
    x = full_tensor(12)
    prefill = [piece(x[[3, 9]], layout="replicated", rank=r, world=2, rows=[3, 9], start=0, tokens=10) for r in (1, 0)]
    steps = [piece(x[[p]], layout="replicated", rank=r, world=2, rows=[p], start=p, tokens=1)
             for p in (10, 11) for r in (0, 1)]
    again = piece(x[[10]], layout="replicated", rank=0, world=2, rows=[10], start=10, tokens=1)
    got = reassemble(prefill + steps + [again])
    assert isinstance(got, Reassembled) and got.rows.tolist() == [3, 9, 10, 11]
    np.testing.assert_array_equal(got.values, x[[3, 9, 10, 11]].astype(np.float64))
    # a forward pass a rank is missing from is named by its positions
    broken = reassemble(prefill + steps[:3])
    assert isinstance(broken, NotReassembled) and broken.why.startswith("in the forward pass of positions 11-11, rank 1")


def test_a_decode_step_counts_only_while_the_steps_before_it_were_the_sequences():
    tokens = [5, 6, 7, 8, 9, 10]
    capture = TensorCapture({"dir": "unused", "sequences": [{"label": "s", "token_ids": tokens, "rows": [3, 4, 5]}]})
    capture.forward_started(torch.tensor(tokens[:3]), torch.arange(3))  # the prompt
    assert capture.current() is not None
    capture.forward_started(torch.tensor([8]), torch.tensor([3]))  # decode step 1: the sequence's token
    assert capture.current() is not None and capture.current().rows == [3]
    capture.forward_started(torch.tensor([99]), torch.tensor([4]))  # the engine generated another token
    assert capture.current() is None
    capture.forward_started(torch.tensor([10]), torch.tensor([5]))  # matches again, but attends to position 4's 99
    assert capture.current() is None
    capture.forward_started(torch.tensor(tokens[:3]), torch.arange(3))  # the sequence again from the start
    assert capture.current() is not None
