"""evalpipe/nightly/simulate.py without its two real source runs (those: tests/e2e/test_nightly.py):
the fault and fix nights checked before anything runs, a simulated night's run directory
built from two recorded runs (its `sp` from the fault run, or from the good run's own A/A
run claiming that run's path), and the summary's word on whether only the fault night
was flagged."""

from __future__ import annotations

import filecmp
from types import SimpleNamespace

import pytest
from nightly_fakes import write_night
from rich.console import Console

from evalpipe.documents.nightly_doc import SeriesChange
from evalpipe.documents.run_doc import read_run_document
from evalpipe.errors import UserError
from evalpipe.nightly import simulate
from tests.report.test_nightly import change


@pytest.mark.parametrize(("options", "message"), [
    ({"nights": 10, "fault_night": 0}, "--fault-night 0 must lie between 1 and 9"),
    ({"nights": 10, "fault_night": 10}, "--fault-night 10 must lie between 1 and 9"),
    ({"nights": 10, "fault_night": 5, "fix_night": 5}, "--fix-night 5 must come after --fault-night 5"),
])
def test_impossible_fault_and_fix_nights_are_refused_before_anything_runs(tmp_path, options, message):
    with pytest.raises(UserError, match=message):
        simulate.simulate(Console(quiet=True), output=tmp_path / "sim", **options)
    assert not (tmp_path / "sim").exists()


@pytest.fixture
def sources(tmp_path):
    """A good run (legacy, its A/A run legacy-aa, sp) and a fault run (sp loses 12 answers)."""
    return write_night(tmp_path / "sources", 0, probes=True), write_night(tmp_path / "sources", 1, fault=True, probes=True)


def test_a_fault_night_holds_the_fault_runs_sp_and_names_the_fault_build(tmp_path, sources):
    good, fault = sources
    night = simulate.build_night(good, fault, tmp_path / "nights" / "night-07", index=7, started_at=1e9,
                                 build="fault", sp_from="sp")
    assert filecmp.cmp(night / "sp" / "samples.parquet", fault / "sp" / "samples.parquet", shallow=False)
    assert filecmp.cmp(night / "legacy" / "samples.parquet", good / "legacy" / "samples.parquet", shallow=False)
    info = read_run_document(night)
    assert (info.run_id, info.kind, info.status, info.started_at) == ("night-07", "nightly", "ok", 1e9)
    assert info.components == {"vllm_ascend": "fault"}
    assert (info.simulated.night, info.simulated.sp_from) == (7, "fault run")
    assert info.verdict == "DIVERGENT" and (night / "compare.json").is_file()


def test_an_aa_night_whose_sp_is_the_reference_s_aa_run_claims_that_run_s_path(tmp_path, sources):
    good, fault = sources
    night = simulate.build_night(good, fault, tmp_path / "nights" / "night-02", index=2, started_at=1e9,
                                 build="good", sp_from="legacy-aa")
    assert filecmp.cmp(night / "sp" / "samples.parquet", good / "legacy-aa" / "samples.parquet", shallow=False)
    info = read_run_document(night)
    assert info.variant_settings["sp"].expect == read_run_document(good).variant_settings["legacy-aa"].expect
    assert info.simulated.sp_from == "legacy-aa" and info.components == {"vllm_ascend": "good"}
    assert info.verdict != "INCONCLUSIVE", "judged by what it ran, the A/A night proves its paths"


def _summary(flagged_first_bad: list[str], fault_night: int | None, nights: int = 5) -> simulate.SimulationSummary:
    results = [SimpleNamespace(judgement=SimpleNamespace(run_id=f"night-{i:02d}")) for i in range(nights)]
    flagged = [SeriesChange.model_validate({**change("flagged", "acc fell"), "first_bad": n}) for n in flagged_first_bad]
    return simulate.SimulationSummary(results, fault_night, None, flagged)


def test_the_summary_is_as_expected_only_when_exactly_the_fault_night_is_flagged():
    assert _summary(["night-03", "night-03"], 3).flagged_nights == ["night-03"]
    assert _summary(["night-03"], 3).as_expected
    assert not _summary([], 3).as_expected, "a fault nobody flagged"
    assert not _summary(["night-01", "night-03"], 3).as_expected, "a false alarm besides"
    assert _summary([], None).as_expected and not _summary(["night-02"], None).as_expected
