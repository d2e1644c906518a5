"""run.json (evalpipe/documents/run_doc.py): a run document round-trips keeping only what was
set, is redacted when written, answers its readers' questions (noise floor, gates,
expectations), refuses what it cannot read in one sentence, and migrates a version-less
run.json."""

from __future__ import annotations

import json

import pytest

from evalpipe.config.expectations import Expectations
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.run_doc import (
    RUN_VERSION,
    Attempt,
    Fingerprints,
    NoiseFloorEntry,
    RunDocument,
    RunModel,
    Timings,
    VariantSettings,
    VariantStatus,
    read_run_document,
    write_run_document,
)
from evalpipe.errors import UserError


def _run_doc() -> RunDocument:
    return RunDocument(
        run_id="run-1", config_path="cfg.yaml", config={"gates": {"scores": {"margin": 0.02}}, "seed": 0},
        fingerprints=Fingerprints(config_sha256="a" * 64, code="0.1.0"), task_selector="gsm8k",
        tasks=[{"group": "gsm8k", "task": "gsm8k_synth_4shot", "limit": 8}], reference="legacy",
        variants=["legacy", "legacy-aa", "sp"],
        variant_settings={"legacy": VariantSettings(description="ref", env={"LAYOUT": "legacy"}, expect={"same_path": True}),
                          "sp": VariantSettings(env={"LAYOUT": "sp"}, engine={"max_num_seqs": 8})},
        noise_floor=NoiseFloorEntry(variant="legacy-aa", of="legacy", reverse_order=True),
        model=RunModel(path="/m", fingerprint="f" * 64, builtin=True, name="builtin:tiny"), kind="nightly",
        status="failed", variant_status={"legacy": VariantStatus(exit_code=0, seconds=1.5, error=None)},
        timings=Timings(model_s=0.5), failed_variants=["sp"], attempts=[Attempt(at=1.0, kept=[], previous_status="interrupted")],
    )


def test_a_run_document_round_trips_and_keeps_only_what_was_set(tmp_path):
    doc = _run_doc()
    write_run_document(tmp_path, doc)
    assert read_run_document(tmp_path) == doc == read_run_document(tmp_path / "run.json")
    raw = json.loads((tmp_path / "run.json").read_text())
    assert raw["version"] == RUN_VERSION and "verdict" not in raw and "stalled" not in raw["variant_status"]["legacy"]
    assert read_run_document(tmp_path / "elsewhere") is None, "no run.json: no document"
    # what the readers ask of it
    assert doc.noise_floor_of("legacy") == "legacy-aa" and doc.noise_floor_of("sp") is None and doc.aa_variant == "legacy-aa"
    assert doc.gates_of().scores.margin == 0.02 and RunDocument().gates_of() == Gates()
    assert doc.expectations_of("legacy") == Expectations(same_path=True) and doc.expectations_of("sp") is None
    # patched by copy, validated, and set fields unset again (resume)
    later = doc.updated(status="ok", verdict="EQUIVALENT").without("failed_variants")
    assert later.status == "ok" and later.failed_variants == [] and "failed_variants" not in later.as_mapping()
    with pytest.raises(ValueError):
        doc.updated(status="finished")


def test_a_run_document_redacts_what_it_writes(tmp_path):
    doc = _run_doc().updated(error="server `vllm serve --api-key sk_secret123` died")
    write_run_document(tmp_path, doc)
    assert "sk_secret123" not in (tmp_path / "run.json").read_text()


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(verdikt="OK"), "run.json: verdikt: Extra inputs are not permitted; fix it, or restore it from a copy."),
    (lambda d: d["noise_floor"].update(name="x"), "run.json: noise_floor.name: Extra inputs are not permitted"),
    (lambda d: d["variant_settings"]["sp"].update(pyhton="/x"), "run.json: variant_settings.sp.pyhton: Extra inputs"),
    (lambda d: d.update(version=2), "is a run.json of version 2; this evalpipe reads version 1"),
    (lambda d: d.update(status="finished"), "run.json: status: Input should be"),
])
def test_a_run_json_this_evalpipe_cannot_read_is_one_sentence(tmp_path, edit, fragment):
    raw = json.loads(_run_doc().model_dump_json(exclude_unset=True))
    raw["version"] = RUN_VERSION
    edit(raw)
    (tmp_path / "run.json").write_text(json.dumps(raw))
    with pytest.raises(UserError) as err:
        read_run_document(tmp_path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_version_less_run_json_is_migrated(tmp_path):
    """run.json written before it had a version (earlier evalpipe, hand-built run directories)
    still reads, its older shapes of variants and model brought to version 1."""
    (tmp_path / "run.json").write_text(json.dumps({
        "run_id": "old", "reference": "legacy", "model": "/models/tiny",
        "variants": [{"name": "legacy", "env": {"LAYOUT": "legacy"}}, "sp"],
        "noise_floor": {"variant": "legacy-aa", "of": "legacy", "reverse_order": True}, "status": "ok",
    }))
    doc = read_run_document(tmp_path)
    assert doc is not None and doc.version == RUN_VERSION and doc.variants == ["legacy", "sp"]
    assert doc.variant_settings["legacy"].env == {"LAYOUT": "legacy"} and doc.model.path == "/models/tiny"
    assert doc.noise_floor_of("legacy") == "legacy-aa" and doc.status == "ok"
    (tmp_path / "run.json").write_text(json.dumps({"variants": {"a": {"engine": {"x": 1}}, "b": {}}}))
    doc = read_run_document(tmp_path)
    assert doc is not None and doc.variants == ["a", "b"] and doc.variant_settings["a"].engine == {"x": 1}
    (tmp_path / "run.json").write_text("{}")
    assert read_run_document(tmp_path) == RunDocument()
