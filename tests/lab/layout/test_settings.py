"""evalpipe/lab/layout/settings.py: the layout model's settings from its config and the environment (defaults, a fault of either layout, graded faults with their magnitude), and every wrong setting refused saying what to fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evalpipe.lab.layout.faults import FAULTS
from evalpipe.lab.layout.settings import resolve


def hf(**kw):
    return SimpleNamespace(num_attention_heads=6, **kw)


def test_settings_defaults():
    s = resolve(hf(), {})
    assert (s.layout, s.tp, s.out_scale, s.faults) == ("legacy", 4, 1.0, frozenset())
    s = resolve(hf(layout_tp=2, layout_out_scale=16384), {"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": "tree_reduce"})
    assert s.describe() == "layout=sp tp=2 out_scale=16384 faults=tree_reduce"


@pytest.mark.parametrize(
    "config,env,message",
    [
        (hf(), {"EVALPIPE_LAYOUT": "pass-through"}, r"EVALPIPE_LAYOUT='pass-through' is not a layout; valid values: legacy, sp\."),
        (hf(), {"EVALPIPE_LAYOUT_FAULT": "oops"}, r"unknown fault 'oops'; valid names"),
        (hf(), {"EVALPIPE_LAYOUT_FAULT": "heads_permuted"}, r"acts on the sp layout; set EVALPIPE_LAYOUT=sp"),
        (hf(), {"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": "residual_not_rescaled"}, r"only exists with an output scale"),
        (hf(layout_tp=8), {}, r"layout_tp=8: .* from 1 to the model's 6 attention heads"),
        (hf(layout_tp="4"), {}, r"layout_tp='4'"),
        (hf(layout_out_scale=0), {}, r"layout_out_scale=0 must be a positive finite number"),
    ],
)
def test_settings_errors_say_what_to_fix(config, env, message):
    with pytest.raises(ValueError, match=message):
        resolve(config, env)


def test_a_fault_of_any_layout_resolves_under_both_and_graded_faults_carry_their_magnitude():
    from evalpipe.lab.layout.faults import GRADED_MAGNITUDES, GRADED_PREFIX, graded_magnitude

    for layout in ("legacy", "sp"):
        s = resolve(hf(), {"EVALPIPE_LAYOUT": layout, "EVALPIPE_LAYOUT_FAULT": "nondeterministic_reduce"})
        assert s.has("nondeterministic_reduce") and s.layout == layout
    names = [GRADED_PREFIX + m for m in GRADED_MAGNITUDES]
    assert [FAULTS[n].magnitude for n in names] == [1e-1, 1e-2, 1e-3, 1e-4, 1e-5]
    assert all(FAULTS[n].harmful and FAULTS[n].layout == "sp" for n in names)
    assert graded_magnitude(frozenset({"attn_out_error_1e-3", "tree_reduce"})) == 1e-3
    assert graded_magnitude(frozenset({"tree_reduce"})) == 0.0
    with pytest.raises(ValueError, match="acts on the sp layout"):
        resolve(hf(), {"EVALPIPE_LAYOUT": "legacy", "EVALPIPE_LAYOUT_FAULT": "attn_out_error_1e-3"})
