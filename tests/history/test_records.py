"""What a run directory contributes to the history (evalpipe/history/records.py): read_run
gives each variant its role, status, components, per-item scores, token figures and gates
from the run's documents, refuses what is no run directory or a changed file in one
sentence, keeps a night's judgement; per-item values round-trip their compact encoding,
and what ran is told in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from nightly_fakes import N_ITEMS, write_night

from evalpipe.documents.manifest import ProbeSummary, VariantManifest
from evalpipe.documents.nightly_doc import NIGHTLY_JSON, NightlyDocument, write_nightly_document
from evalpipe.documents.run_doc import Fingerprints, RunDocument
from evalpipe.history import HistoryError, records
from evalpipe.history import store as h
from evalpipe.rundir.artifacts import RunDir


@pytest.mark.parametrize("values", [[1, 0, 1, 1, 0, 0, 0, 1, 1], [0.5, 1.0, np.nan, 0.25]])
def test_item_encoding_round_trips(values):
    arr = np.array(values, dtype=np.float64)
    enc, data = h.encode_items(arr)
    assert enc == ("bits" if np.all(np.isin(arr, (0, 1))) else "f32")
    np.testing.assert_array_equal(h.decode_items(enc, data, arr.size), arr)


def _probes(**fields) -> ProbeSummary:
    base = {"mode": "offline", "verifiable": True, "processes": {"engine": 1}, "models": [], "layers": {}, "switches": {},
            "calls": {}, "absent": [], "collectives_per_forward": {}, "forwards": 0}
    return ProbeSummary.model_validate({**base, **fields})


def test_collectives_whose_count_varies_are_shown_with_how_often():
    probes = _probes(models=["m.Model"], layers={"m.Layer": 2},
                     collectives_per_forward={"all_gather": {"counts": {"2": 40, "0": 8}, "forwards": 48}})
    assert records.describe_what_ran(probes) == "Model; layers 2 Layer; per forward: all_gather 2 in 40 of 48, 0 in 8 of 48"
    assert records.describe_what_ran(_probes(verifiable=False, mode="endpoint")).startswith("not verifiable (endpoint mode")
    assert records.describe_what_ran(None).startswith("not recorded")


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A night whose sp lost 12 right answers (written once: a comparison runs to write it)."""
    return write_night(tmp_path_factory.mktemp("nights"), 0, fault=True)


def _copy(night, tmp_path):
    return Path(shutil.copytree(night, tmp_path / night.name))


def test_read_run_gives_each_variant_its_role_status_scores_and_gates(night):
    record = records.read_run(night, labels={"vllm_ascend": "bad7"})
    assert record.run.run_id == "night-00" and record.run.kind == "nightly" and record.run.aa_variant == "legacy-aa"
    assert record.run.judgement is None and record.run.nightly_status is None, "no nightly.json: not a judged night"
    vs = {v.row.name: v for v in record.variants}
    assert {n: (v.row.role, v.row.status) for n, v in vs.items()} == {
        "legacy": ("reference", None), "legacy-aa": ("aa", "IDENTICAL"), "sp": ("variant", "DIVERGENT")}
    assert vs["sp"].row.components["vllm_ascend"] == "bad7", "a label CI passes wins over the run's own"
    assert vs["legacy"].gates == [] and vs["legacy-aa"].gates == [] and vs["sp"].gates
    sp, legacy = vs["sp"].scores[0], vs["legacy"].scores[0]
    assert len(sp.keys) == N_ITEMS and sp.keys == legacy.keys and sp.digest == legacy.digest
    assert legacy.mean - sp.mean == pytest.approx(12 / N_ITEMS)
    free = [t for t in vs["sp"].tokens if t.source == "free"]
    assert free and free[0].n_divergent == 12


def test_read_run_refuses_what_it_cannot_record_in_one_sentence(night, tmp_path):
    with pytest.raises(HistoryError, match="has no run.json"):
        records.read_run(tmp_path)
    run_dir = _copy(night, tmp_path)
    RunDir(run_dir).variant("sp").manifest.unlink()  # its files can no longer be checked
    with pytest.raises(HistoryError, match="sp/manifest.json is missing"):
        records.read_run(run_dir)


def test_a_judged_night_brings_its_judgement(night, tmp_path):
    run_dir = _copy(night, tmp_path)
    write_nightly_document(run_dir / NIGHTLY_JSON, NightlyDocument(run_id="night-00", status="REGRESSION", baseline="night-01"))
    run = records.read_run(run_dir).run
    assert run.nightly_status == "REGRESSION" and run.baseline_run_id == "night-01"
    assert run.judgement is not None and run.judgement.baseline == "night-01"
    (run_dir / NIGHTLY_JSON).write_text(json.dumps({"run_id": "x", "version": 9}))
    with pytest.raises(HistoryError, match="nightly.json of version 9"):
        records.judgement_of(run_dir)


def test_item_scores_leave_missing_items_out_of_mean_and_se():
    scores = records.ItemScores("t", "acc", ((0, 0, "a"), (1, 0, "b"), (2, 0, "c")), np.array([1.0, np.nan, 0.0]))
    assert scores.mean == 0.5 and scores.se == pytest.approx(0.5)
    single = records.ItemScores("t", "acc", ((0, 0, "a"),), np.array([1.0]))
    assert single.se is None and records.ItemScores("t", "acc", (), np.array([])).mean is None
    assert scores.digest != records.ItemScores("u", "acc", scores.keys, scores.values).digest, "the task is in the item set"


def test_components_carry_versions_their_commits_and_labels():
    manifest = VariantManifest(variant="sp", status="ok",
                               versions={"vllm": "0.7.3.dev12+g1a2b3c4", "torch": "2.13.0+cpu", "vllm_ascend": None})
    run = RunDocument(fingerprints=Fingerprints(code="0.1.0"))
    assert records.components_of(manifest, run, {"torch": "pinned"}) == {
        "vllm": "0.7.3.dev12+g1a2b3c4", "vllm_commit": "1a2b3c4", "torch": "pinned", "evalpipe": "0.1.0"}
