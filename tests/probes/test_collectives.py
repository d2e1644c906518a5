"""evalpipe/probes/collectives.py: the one vocabulary of collective names the hooks record
and the config's `expect.per_forward` checks. Pinned: every kind is recorded bare and per
group, a name no probe records is refused with why and the closest name, and a virtual
collective outside the vocabulary is a bug of its caller."""

from __future__ import annotations

import pytest

from evalpipe.probes.collectives import (
    RECORDED,
    collective_problem,
    is_recorded,
    looks_collective,
    recorded_names,
    virtual,
)


def test_every_kind_is_recorded_bare_and_on_each_group_that_has_it():
    names = set(recorded_names())
    for group, kinds in RECORDED.items():
        assert all(f"{kind}@{group}" in names and kind in names for kind in kinds)
    assert all(is_recorded(name) for name in names) and len(names) == len(recorded_names())


def test_a_name_no_probe_records_is_refused_with_why_and_the_closest_name():
    assert collective_problem("all_reduce@tp") is None and collective_problem("all_reduce") is None
    assert "nothing follows `@`" in collective_problem("all_reduce@")
    assert "no all_to_all is recorded on group `tp` (its kinds: all_reduce" in (collective_problem("all_to_all@tp") or "")
    unknown_group = collective_problem("all_reduce@tq")
    assert unknown_group is not None and "`tq` is not a group the probes know" in unknown_group
    assert unknown_group.endswith("did you mean `all_reduce@tp`?")
    misspelt = collective_problem("allreduce")
    assert misspelt is not None and "is not a collective kind the probes record" in misspelt


def test_what_reads_as_a_collective_and_the_virtual_ranks_names():
    assert looks_collective("all_reduce@tp") and looks_collective("all_gather")
    assert not looks_collective("vllm.distributed.parallel_state.GroupCoordinator.all_reduce")
    kind = next(iter(RECORDED["virtual"]))
    assert virtual(kind) == f"{kind}@virtual"
    with pytest.raises(ValueError, match="is not a virtual collective"):
        virtual("broadcast_everything")
