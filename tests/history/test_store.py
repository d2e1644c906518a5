"""The history database on SQLite: schema and migrations, recording run directories,
per-item values, rebuild by import, baselines, export."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from nightly_fakes import LAYER, MODEL, N_ITEMS, V1_VARIANT_COLUMNS, write_night, write_v1_history

from evalpipe.history import records
from evalpipe.history import store as h
from evalpipe.history.store import HistoryError, open_history


@pytest.fixture
def db(tmp_path):
    return open_history(None, tmp_path / "out")


def test_default_database_is_one_sqlite_file_under_the_output_root(tmp_path):
    hist = open_history(None, tmp_path / "out")
    assert (tmp_path / "out" / h.DEFAULT_FILE).is_file()
    with hist.engine.connect() as conn:
        assert h.current_version(conn) == h.SCHEMA_VERSION
        tables = set(sa.inspect(conn).get_table_names())
    assert {"runs", "variants", "scores", "item_sets", "token_summaries", "gate_results", "baselines", "schema_version"} <= tables


def test_migrations_are_applied_once_and_a_newer_schema_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    open_history(url, tmp_path)
    open_history(url, tmp_path)  # again: nothing to apply
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(h.schema_version)).scalar() == len(h.MIGRATIONS)
    with engine.begin() as conn:
        conn.execute(h.schema_version.insert().values(version=99, description="future", applied_at=0.0))
    with pytest.raises(HistoryError, match="schema version 99, newer than"):
        open_history(url, tmp_path)


def test_a_bad_url_is_one_sentence(tmp_path):
    with pytest.raises(HistoryError, match="is not an SQLAlchemy URL"):
        open_history("not a url", tmp_path)
    with pytest.raises(HistoryError, match="cannot open the history database"):
        open_history("postgresql+psycopg://nobody:secret@127.0.0.1:1/none", tmp_path)


def test_password_never_shown():
    assert "secret" not in h.shown_url("postgresql+psycopg://me:secret@db/h")


def test_a_run_is_recorded_with_scores_items_tokens_gates_and_components(tmp_path, db):
    run_dir = write_night(tmp_path, 0, fault=True, components={"vllm_ascend": "bad7"})
    run_id = db.record(run_dir)
    run = db.run(run_id)
    assert run.kind == "nightly" and run.config_hash == "cfg1" and run.verdict == "DIVERGENT"
    assert run.model_fingerprint == "f" * 64
    vs = {v.name: v for v in db.variants_of(run_id)}
    assert {n: v.role for n, v in vs.items()} == {"legacy": "reference", "legacy-aa": "aa", "sp": "variant"}
    assert vs["sp"].status == "DIVERGENT" and vs["legacy-aa"].status == "IDENTICAL"
    assert vs["sp"].components["vllm_ascend"] == "bad7" and vs["sp"].components["vllm"] == "0.32.0"
    assert vs["sp"].components["evalpipe"] == "v0.1.0-abc"
    scores = {r.variant: r for r in db.score_rows([run_id], with_items=True)}
    assert scores["sp"].n == N_ITEMS
    assert scores["legacy"].mean - scores["sp"].mean == pytest.approx(12 / N_ITEMS)
    assert int(np.sum(scores["legacy"].items != scores["sp"].items)) == 12
    keys = db.item_keys(scores["sp"].item_set_pk)
    assert keys[0][:2] == (0, 0) and len(keys) == N_ITEMS
    gates = db.gate_rows(run_id)
    assert any(g.gate == "score_mcnemar" and g.status == "fail" for g in gates)
    tokens = [t for t in db.token_rows([run_id]) if t.variant == "sp" and t.source == "free"]
    assert tokens and tokens[0].n_divergent == 12


def test_the_item_set_is_stored_once_across_nights(tmp_path, db):
    for i in range(3):
        db.record(write_night(tmp_path, i))
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(h.item_sets)).scalar() == 1


def test_recording_again_replaces_and_import_rebuilds_the_same_database(tmp_path, db):
    dirs = [write_night(tmp_path, i, fault=i == 2) for i in range(3)]
    for d in dirs:
        db.record(d)
    db.record(dirs[1])  # again: replaced, not duplicated
    assert [r.run_id for r in db.runs()] == ["night-00", "night-01", "night-02"]
    rebuilt = open_history(f"sqlite:///{tmp_path / 'rebuilt.sqlite'}", tmp_path)
    for d in dirs:
        rebuilt.record(d)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "recorded_at"} for r in rows]  # noqa: E731
    assert strip(rebuilt.export_rows()) == strip(db.export_rows())


def test_not_a_run_directory_is_one_sentence(tmp_path, db):
    with pytest.raises(HistoryError, match="is not a run directory"):
        db.record(tmp_path)


def test_baseline_pins_and_unknown_names(tmp_path, db):
    db.record(write_night(tmp_path, 0))
    db.record(write_night(tmp_path, 1))
    assert db.pinned_baseline("sp") is None
    db.pin_baseline("night-00")
    assert db.pinned_baseline("sp") == "night-00"
    db.pin_baseline("night-01", "sp")
    assert db.pinned_baseline("sp") == "night-01" and db.pinned_baseline("legacy") == "night-00"
    with pytest.raises(HistoryError, match="no run 'nope'"):
        db.pin_baseline("nope")
    with pytest.raises(HistoryError, match="has no variant 'xx'"):
        db.pin_baseline("night-00", "xx")


def test_export_csv_and_parquet(tmp_path, db):
    for i in range(2):
        db.record(write_night(tmp_path, i))
    h.export(db, tmp_path / "h.csv", "csv")
    h.export(db, tmp_path / "h.parquet", "parquet")
    csv_rows = pacsv.read_csv(tmp_path / "h.csv").to_pylist()
    pq_rows = pq.read_table(tmp_path / "h.parquet").to_pylist()
    assert len(csv_rows) == len(pq_rows) == 2 * 3  # nights x variants (one metric)
    assert {r["variant"] for r in pq_rows} == {"legacy", "legacy-aa", "sp"}
    assert json.loads(pq_rows[0]["components"])["vllm"] == "0.32.0"


def _variant_columns(db) -> list[str]:
    with db.engine.connect() as conn:
        return [c["name"] for c in sa.inspect(conn).get_columns("variants")]


def test_a_schema_1_database_upgrades_in_place_and_keeps_its_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    write_v1_history(url, write_night(tmp_path / "runs", 0))
    with sa.create_engine(url).connect() as conn:
        assert h.current_version(conn) == 1
        assert [c["name"] for c in sa.inspect(conn).get_columns("variants")] == V1_VARIANT_COLUMNS
    db = open_history(url, tmp_path)
    with db.engine.connect() as conn:
        assert h.current_version(conn) == h.SCHEMA_VERSION == 3
    # the upgraded database has the schema a new one gets
    assert _variant_columns(db) == V1_VARIANT_COLUMNS + ["probes", "path_status"] == _variant_columns(open_history(None, tmp_path / "new"))
    old = {v.name: v for v in db.variants_of("night-00")}
    assert old["sp"].status == "IDENTICAL" and old["sp"].probes is None and old["sp"].path_status is None
    # and records what ran from now on
    db.record(write_night(tmp_path / "runs", 1, probes=True))
    new = {v.name: v for v in db.variants_of("night-01")}
    assert new["sp"].path_status == "verified" and new["sp"].probes.models == [MODEL]


def test_a_history_opened_to_read_is_never_created_migrated_or_written(tmp_path):
    missing = tmp_path / "no" / "dir" / "h.sqlite"
    for access in ("read", "update"):
        with pytest.raises(HistoryError, match=rf"^there is no history at sqlite:///{missing} \({missing} does not exist\); "):
            open_history(f"sqlite:///{missing}", tmp_path, access=access)
    assert not (tmp_path / "no").exists()
    # a schema 1 database is read as it is: not upgraded, the later columns read as None
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    write_v1_history(url, write_night(tmp_path / "runs", 0))
    before = (tmp_path / "old.sqlite").read_bytes()
    db = open_history(url, tmp_path, access="read")
    assert db.version == 1 and [r.run_id for r in db.runs()] == ["night-00"]
    sp = next(v for v in db.variants_of("night-00") if v.name == "sp")
    assert sp.status == "IDENTICAL" and sp.probes is None and sp.path_status is None
    assert db.export_rows() == db.score_rows() == []  # read through the v1 columns (write_v1_history stores no scores)
    with pytest.raises(sa.exc.OperationalError, match="readonly database"):  # SQLite itself refuses
        db.pin_baseline("night-00")
    db.engine.dispose()
    assert (tmp_path / "old.sqlite").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.sqlite", "runs"]
    # a newer schema is refused by readers too
    with sa.create_engine(url).begin() as conn:
        conn.execute(h.schema_version.insert().values(version=99, description="future", applied_at=0.0))
    with pytest.raises(HistoryError, match="schema version 99, newer than"):
        open_history(url, tmp_path, access="read")


def test_an_import_reads_every_run_before_writing(tmp_path, db):
    """A night whose nightly.json is broken is refused while reading, before the database
    is touched (the judgement used to be read inside the write)."""
    run_dir = write_night(tmp_path / "runs", 0)
    (run_dir / "nightly.json").write_text("{broken")
    with pytest.raises(HistoryError, match="nightly.json"):
        h.read_run(run_dir)
    assert db.runs() == []


def test_what_ran_is_recorded_per_variant(tmp_path, db):
    db.record(write_night(tmp_path, 0, probes=True, sp_ran="legacy"))
    vs = {v.name: v for v in db.variants_of("night-00")}
    assert {n: v.path_status for n, v in vs.items()} == {"legacy": None, "legacy-aa": "verified", "sp": "failed"}
    assert {n: v.status for n, v in vs.items()} == {"legacy": None, "legacy-aa": "IDENTICAL", "sp": "INCONCLUSIVE"}
    assert db.run("night-00").verdict == "INCONCLUSIVE"
    sp = vs["sp"].probes
    assert sp is not None and sp.layers == {LAYER: 3}
    assert sp.collectives_per_forward["all_gather"].model_dump() == {"counts": {"3": 48}, "forwards": 48}
    assert records.describe_what_ran(sp) == ("LayoutForCausalLM; layers 3 LayoutDecoderLayer; "
                                       "per forward: all_gather 3; reduce_scatter 3")
    assert records.describe_what_ran(None) == "not recorded (the run predates path probes)"
    rows = {r["variant"]: r for r in db.export_rows()}
    assert rows["sp"]["variant_status"] == "INCONCLUSIVE" and rows["sp"]["path_status"] == "failed"
    assert rows["legacy"]["run_verdict"] == "INCONCLUSIVE"


def _open_new_history(root: str) -> int:
    from pathlib import Path

    from evalpipe.history.store import open_history as opener

    return opener(None, Path(root)).version


def test_processes_opening_a_new_history_at_once_all_get_its_schema(tmp_path):
    """Nights side by side (`nightly -c A -c B` on a cluster) create one SQLite history at
    once: each sees the schema, none fails on a table another created first."""
    from concurrent.futures import ProcessPoolExecutor

    for attempt in range(3):
        root = tmp_path / str(attempt)
        root.mkdir()
        with ProcessPoolExecutor(4) as pool:
            versions = list(pool.map(_open_new_history, [str(root)] * 4))
        assert len(set(versions)) == 1 and versions[0] > 0


def test_each_tasks_own_verdict_is_a_series_and_a_rerecorded_run_replaces_its_rows(tmp_path, db):
    dirs = [write_night(tmp_path, i, fault=i == 1) for i in range(3)]
    for d in dirs:
        db.record(d)
    db.record(dirs[1])
    rows = [r for r in db.task_verdict_rows() if r.variant == "sp"]
    assert [(r.run_id, r.status) for r in rows] == [("night-00", "IDENTICAL"), ("night-01", "DIVERGENT"), ("night-02", "IDENTICAL")]
    assert {r.role for r in db.task_verdict_rows()} == {"variant", "aa"}  # the reference is compared with nothing
    assert [r.run_id for r in db.task_verdict_rows(["night-02"])] == ["night-02", "night-02"]
    # a schema 1 database read as it is has no task verdicts; upgraded, it records them from then on
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    write_v1_history(url, write_night(tmp_path / "old-runs", 0))
    assert open_history(url, tmp_path, access="read").task_verdict_rows() == []
    upgraded = open_history(url, tmp_path)
    upgraded.record(dirs[1])
    assert [r.status for r in upgraded.task_verdict_rows() if r.variant == "sp"] == ["DIVERGENT"]
