"""evalpipe/engine_patches/switches.py: the switches that ask for evalpipe's changes inside vLLM's processes default to nothing, and a value that is not one is refused naming the valid ones, with the layout model's switches checked against the zoo's own names."""

from __future__ import annotations

import pytest

from evalpipe.engine_patches.switches import CPU_EP_ENV, SP_MOE_ENV, requested


def test_switches_default_to_nothing_and_refuse_unknown_values():
    assert not requested({}).anything
    assert requested({CPU_EP_ENV: "1", SP_MOE_ENV: "Replicated"}) == requested({CPU_EP_ENV: "on", SP_MOE_ENV: "replicated"})
    with pytest.raises(ValueError, match=r"EVALPIPE_SP_MOE='sp' is not a layout; valid values: vllm, replicated, fixed"):
        requested({SP_MOE_ENV: "sp"})
    with pytest.raises(ValueError, match=r"EVALPIPE_CPU_EP='yes please' is not a switch value"):
        requested({CPU_EP_ENV: "yes please"})


def test_the_layout_models_switches_are_checked_with_the_zoos_own_names():
    from evalpipe.engine_patches.switches import LAYOUT_FAULT_NAMES, check_env
    from evalpipe.lab.layout.faults import FAULTS

    assert LAYOUT_FAULT_NAMES == tuple(FAULTS)  # the planner's list is the zoo's
    check_env({"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": "none, shard_offset"})
    with pytest.raises(ValueError, match=r"EVALPIPE_LAYOUT='SP' is not a layout; valid values: legacy, sp"):
        check_env({"EVALPIPE_LAYOUT": "SP"})
    for slip in ("", " sp", "sp "):  # set, but to no layout as written (the input fuzzer found "")
        with pytest.raises(ValueError, match="is not a layout"):
            check_env({"EVALPIPE_LAYOUT": slip})
    check_env({})  # unset: the default layout
    with pytest.raises(ValueError, match=r"unknown fault 'shard_ofset'"):
        check_env({"EVALPIPE_LAYOUT_FAULT": "shard_ofset"})
