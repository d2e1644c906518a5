"""evalpipe/lab/layout/faults.py: the zoo of layout faults, each harmful or benign, on its layout, documented; and a fault list as the environment writes it, an unknown name refused with the valid ones."""

from __future__ import annotations

import pytest

from evalpipe.engine_patches.switches import LAYOUTS
from evalpipe.lab.layout.faults import FAULTS, parse_faults


def test_fault_registry_names_harm_and_layout():
    assert {n for n, f in FAULTS.items() if f.harmful} >= {
        "shard_offset", "double_reduce", "heads_permuted", "scale_after_reduce", "padding_not_zeroed",
        "residual_not_rescaled", "subtle_last_layer_boundary",
    }
    assert {n for n, f in FAULTS.items() if not f.harmful} >= {"tree_reduce", "reduce_fp64"}
    for fault in FAULTS.values():
        assert (fault.layout in LAYOUTS or fault.layout == "any") and len(fault.doc) > 100
        assert (fault.out_scale is not None) == fault.needs_scale


def test_parse_faults():
    assert parse_faults(None) == frozenset() == parse_faults("none") == parse_faults(" , ")
    assert parse_faults("tree_reduce, heads_permuted") == {"tree_reduce", "heads_permuted"}
    with pytest.raises(ValueError, match=r"unknown fault 'heads_swapped'; valid names: none, shard_offset, "):
        parse_faults("heads_swapped")
