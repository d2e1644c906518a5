"""evalpipe/lab/layout/probe.py: the probe's setting syntax (layout@scale:fault+fault) validated exactly like the environment's."""

from __future__ import annotations

import pytest


def test_probe_setting_syntax_is_validated_like_the_environment():
    from evalpipe.lab.layout.probe import parse_setting

    s = parse_setting("sp@16384:residual_not_rescaled+tree_reduce", num_heads=6, tp=4)
    assert s.describe() == "layout=sp tp=4 out_scale=16384 faults=residual_not_rescaled,tree_reduce"
    with pytest.raises(ValueError, match="only exists with an output scale"):
        parse_setting("sp:scale_after_reduce", num_heads=6, tp=4)
