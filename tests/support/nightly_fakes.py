"""Hand-built nights for the history / nightly unit tests: run directories written
with the real artifact writers and compared with the real comparison (no engine).

With ``probes=True`` a night is one of today's runs: run.json records each variant's
expectations (those of configs/default.yaml: legacy gathers around attention, sp passes
shards through with all_to_all) and each variant directory has the probes.json and
manifest "probes" summary its engine process would have left, of the path it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes import FakeSample, make_samples, mutate, record_artifacts, set_column, set_token, update_manifest, write_run

from evalpipe.compare.code_paths import ModelProbe, ProcessProbe, VariantProbes, summarize
from evalpipe.config.expectations import Expectations
from evalpipe.documents.run_doc import read_run_document, write_run_document
from evalpipe.pipeline.comparing import compare_run, write_outputs
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import PROBES_JSON, RunDir

DAY = 86400.0
T0 = 1_780_000_000.0
N_ITEMS = 200

MODEL = "evalpipe.lab.layout.model.LayoutForCausalLM"
LAYER = "evalpipe.lab.layout.model.LayoutDecoderLayer"
ATTENTION = {"legacy": f"{LAYER}._legacy_attention", "sp": f"{LAYER}._sp_attention"}
# collectives of the virtual ranks per forward pass: one per decoder layer (3)
COLLECTIVES = {"legacy": ("all_gather", "reduce_scatter"), "sp": ("all_to_all", "reduce_scatter")}
N_LAYERS, FORWARDS = 3, 48


def expectations(path: str) -> Expectations:
    """What configs/default.yaml declares for the variant of ``path`` ("legacy" or "sp")."""
    other = "sp" if path == "legacy" else "legacy"
    per_forward = {kind: N_LAYERS for kind in COLLECTIVES[path]}
    per_forward.update({kind: 0 for kind in COLLECTIVES[other] if kind not in per_forward})
    return Expectations(model=MODEL, layers=[LAYER], called=[ATTENTION[path]], not_called=[ATTENTION[other]],
                        per_forward=per_forward)


def probes_of(variant: str, path: str, expect: Expectations) -> VariantProbes:
    """The records of one offline engine process of ``variant`` that ran ``path``."""
    model = ModelProbe(model_class=MODEL, layers={LAYER: N_LAYERS}, attention_backends=["CPU_ATTN"], forwards=FORWARDS,
                       forward_tokens=[1221] + [4] * 7, per_forward={kind: {str(N_LAYERS): FORWARDS} for kind in COLLECTIVES[path]})
    process = ProcessProbe(variant=variant, pid=4242, ppid=4241, process_name="MainProcess", role="other", argv=[],
                           started_at=T0, updated_at=T0 + 30, models=[model],
                           switches={"dtype": "float32", "tensor_parallel_size": 1}, switch_errors={},
                           calls={ATTENTION[path]: N_LAYERS * FORWARDS},
                           collectives={f"{kind}@virtual": N_LAYERS * FORWARDS for kind in COLLECTIVES[path]},
                           shapes={}, absent={}, errors=[])
    return VariantProbes(variant=variant, mode="offline", verifiable=True,
                         names={n: n for n in expect.probed_names()}, processes=[process])


def add_probes(vdir: artifacts.VariantDir, doc: VariantProbes) -> None:
    """probes.json and the manifest's summary, as evalpipe.probing.records.gather leaves them."""
    artifacts.write_text(vdir.root / PROBES_JSON, doc.model_dump_json(indent=2) + "\n")
    update_manifest(vdir, probes=summarize(doc, list(doc.names)))


def base_samples() -> list[FakeSample]:
    # about 60 % right, deterministic
    return make_samples(n=N_ITEMS, scores=[float((i * 7) % 10 < 6) for i in range(N_ITEMS)])


def faulty(samples: list[FakeSample], n_wrong: int = 12) -> list[FakeSample]:
    """The fault: ``n_wrong`` right answers go wrong and their first token changes."""
    out = samples
    right = [s.doc_id for s in samples if s.scores[next(iter(s.scores))] == 1.0][:n_wrong]
    for doc in right:
        out = mutate(out, doc, set_token(0, 7))
        out = [s.copy(scores={k: 0.0 for k in s.scores}) if s.doc_id == doc else s for s in out]
    return out


def write_night(root: Path, i: int, *, fault: bool = False, components: dict[str, str] | None = None,
                config_hash: str = "cfg1", extra: dict[str, Any] | None = None, probes: bool = False,
                sp_ran: str = "sp", reference_fault: bool = False) -> Path:
    """Night ``i``: legacy (reference), its A/A run and sp. ``fault``: sp loses 12 right
    answers; ``reference_fault``: so do legacy and its A/A run (tonight's build broke the
    reference path); ``probes``: with path probes and expectations; ``sp_ran="legacy"``:
    sp silently fell back to the legacy path (the sp_fallback fault: legacy's outputs exactly)."""
    good = base_samples()
    reference = faulty(good) if reference_fault else good
    sp = reference if sp_ran == "legacy" else faulty(good) if fault else good
    run_dir = Path(root) / f"night-{i:02d}"
    settings: dict[str, dict[str, Any]] = {"legacy": {"env": {"EVALPIPE_LAYOUT": "legacy"}}, "legacy-aa": {"env": {"EVALPIPE_LAYOUT": "legacy"}},
                                           "sp": {"env": {"EVALPIPE_LAYOUT": "sp"}}}
    claims = {"legacy": expectations("legacy"), "legacy-aa": expectations("legacy").model_copy(update={"same_path": True}),
              "sp": expectations("sp")}
    if probes:
        for name, expect in claims.items():
            settings[name]["expect"] = expect.model_dump(mode="json", exclude_defaults=True)
    write_run(
        run_dir, {"legacy": reference, "legacy-aa": reference, "sp": sp}, reference="legacy", noise_floor="legacy-aa",
        run_info={"status": "ok", "started_at": T0 + i * DAY, "kind": "nightly", "task_selector": "gsm8k",
                  "fingerprints": {"config_sha256": config_hash, "code": "v0.1.0-abc"},
                  "components": components or {"vllm_ascend": "good1"},
                  "variant_settings": settings,
                  "model": {"name": "builtin:tiny-gsm", "fingerprint": "f" * 64},
                  **(extra or {})},
    )
    ran = {"legacy": "legacy", "legacy-aa": "legacy", "sp": sp_ran}
    for name in ("legacy", "legacy-aa", "sp"):
        vd = RunDir(run_dir).variant(name)
        update_manifest(vd, versions={"vllm": "0.32.0", "torch": "2.13.0+cpu", "vllm_ascend": None})
        if probes:
            add_probes(vd, probes_of(name, ran[name], claims[name]))
    comparison = compare_run(run_dir)
    info = read_run_document(run_dir).updated(verdict=comparison.status.value)
    write_run_document(run_dir, info)
    write_outputs(run_dir, comparison, info)
    return run_dir


# -- a history database as the previous evalpipe wrote it ---------------------------

# The variants table of schema 1 (evalpipe before path probes), column for column.
V1_VARIANT_COLUMNS = ["id", "run_pk", "name", "role", "status", "exit_code", "components", "settings"]


def write_v1_history(url: str, run_dir: Path) -> None:
    """A history at schema version 1 holding ``run_dir``'s run and variants, written with
    the columns that version had (what it could not hold: per-item scores aside)."""
    import sqlalchemy as sa

    from evalpipe.history import store as h

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        h.schema_version.create(conn)
        h.MIGRATIONS[0].apply(conn)
        conn.execute(h.schema_version.insert().values(version=1, description=h.MIGRATIONS[0].description, applied_at=T0))
    rec = h.read_run(run_dir)
    with engine.begin() as conn:
        run_pk = conn.execute(h.runs.insert().values(**h.run_values(rec.run), recorded_at=T0)).inserted_primary_key[0]
        for v in rec.variants:
            row = v.row.model_dump(mode="json")
            conn.execute(h.variants.insert().values(run_pk=run_pk, **{k: row[k] for k in V1_VARIANT_COLUMNS[2:]}))
    engine.dispose()


def write_localizable_run(run_dir: Path, config: dict[str, Any]) -> Path:
    """A DIVERGENT run (legacy, its A/A legacy-aa, and sp) with what `evalpipe localize`
    reads: ``config`` (a run config's document) in run.json, teacher-forced scores that
    differ for sp, the reference's prompt token ids, compare.json, and every variant's
    artifacts recorded in its manifest."""
    good = base_samples()
    forced = good
    for doc in range(0, 20, 3):
        forced = mutate(forced, doc, lambda s: s.copy(logprobs=[lp - 0.5 for lp in s.logprobs]))
    write_run(run_dir, {"legacy": good, "legacy-aa": good, "sp": faulty(good)}, reference="legacy", noise_floor="legacy-aa",
              teachers={"legacy": good, "legacy-aa": good, "sp": forced}, run_info={"status": "ok", "kind": "run", "config": config})
    for variant in ("legacy", "legacy-aa", "sp"):
        vdir = RunDir(run_dir).variant(variant)
        table = artifacts.read_table(vdir.samples)
        artifacts.write_table(vdir.samples, set_column(table, "prompt_token_ids", [[1, 2, 3, 4]] * table.num_rows))
    comparison = compare_run(run_dir)
    info = read_run_document(run_dir).updated(verdict=comparison.status.value)
    write_run_document(run_dir, info)
    write_outputs(run_dir, comparison, info)
    for variant in ("legacy", "legacy-aa", "sp"):
        record_artifacts(RunDir(run_dir).variant(variant))
    return run_dir
