"""evalpipe/engine_patches/checks.py: each patch still fits the installed vLLM, and a check fails when the gap it works around is closed upstream (then re-check docs/sp-moe.md)."""

from __future__ import annotations

import pytest

from evalpipe.engine_patches import checks, cpu_collectives


@pytest.mark.parametrize("check", [checks.plugin_registered, checks.vllm_version, checks.cpu_collectives_gap,
                                   checks.cpu_experts_gap, checks.sp_moe_fix_applies])
def test_each_patch_still_fits_the_installed_vllm(check):
    """An upgrade fails here first (evalpipe doctor says the same for a variant's own
    interpreter): a patch that no longer applies, a gap upstream has closed, another
    version than the patches were written for. Then re-check docs/sp-moe.md."""
    name, ok, detail = check()
    assert ok, f"{name}: {detail}"


def test_a_check_fails_when_its_gap_is_closed(monkeypatch):
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    monkeypatch.setattr(CpuCommunicator, "all_gatherv", cpu_collectives.all_gatherv, raising=False)
    name, ok, detail = checks.cpu_collectives_gap()
    assert not ok and "unnecessary" in detail
