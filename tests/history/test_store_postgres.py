"""The history on a real PostgreSQL server (started by the test, 127.0.0.1 only): the
same records, judgements and exports as on SQLite."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from nightly_fakes import MODEL, V1_VARIANT_COLUMNS, write_night, write_v1_history
from postgres_server import postgres_server

from evalpipe.history import store as h
from evalpipe.history.store import HistoryError, open_history
from evalpipe.nightly import night as nightly


@pytest.fixture(scope="module")
def pg_url():
    with postgres_server() as url:
        yield url


def test_postgres_records_judges_and_matches_sqlite(tmp_path, pg_url):
    pg = open_history(pg_url, tmp_path)
    lite = open_history(None, tmp_path / "lite")
    with pg.engine.connect() as conn:
        assert conn.dialect.name == "postgresql"
        assert h.current_version(conn) == h.SCHEMA_VERSION
    statuses = {}
    for i, fault in enumerate([False, False, True, True]):
        run_dir = write_night(tmp_path / "runs", i, fault=fault, components={"vllm_ascend": "bad" if fault else "good"})
        for name, db in (("pg", pg), ("lite", lite)):
            r = nightly.record_and_judge(db, run_dir, labels={}, alpha=1e-3, min_nights=2,
                                         dashboard=tmp_path / name / "index.html", title="t")
            statuses.setdefault(name, []).append(r.judgement.status)
    assert statuses["pg"] == statuses["lite"] == ["PASS", "PASS", "REGRESSION", "REGRESSION"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "recorded_at"} for r in rows]  # noqa: E731
    assert strip(pg.export_rows()) == strip(lite.export_rows())
    last = pg.run("night-03").judgement
    assert last is not None and any(c.state == "flagged" and c.first_bad == "night-02" for c in last.changes)
    # import again into PostgreSQL: replaced, not duplicated, judgement kept
    pg.record(tmp_path / "runs" / "night-03")
    assert len(pg.runs()) == 4 and pg.run("night-03").nightly_status == "REGRESSION"
    with pg.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(h.item_sets)).scalar() == 1


def test_postgres_url_shown_without_password(tmp_path, pg_url):
    db = open_history(pg_url.replace("evalpipe@", "evalpipe:s3cret@"), tmp_path)
    assert "s3cret" not in db.where and "127.0.0.1" in db.where


def test_postgres_schema_1_database_upgrades_in_place(tmp_path, pg_url):
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("CREATE DATABASE history_v1"))
    admin.dispose()
    url = pg_url.rsplit("/", 1)[0] + "/history_v1"
    write_v1_history(url, write_night(tmp_path / "runs", 0))
    db = open_history(url, tmp_path)
    with db.engine.connect() as conn:
        assert h.current_version(conn) == h.SCHEMA_VERSION
        columns = [c["name"] for c in sa.inspect(conn).get_columns("variants")]
    assert columns == V1_VARIANT_COLUMNS + ["probes", "path_status"]
    assert {v.name: v.probes for v in db.variants_of("night-00")} == {"legacy": None, "legacy-aa": None, "sp": None}
    db.record(write_night(tmp_path / "runs", 1, probes=True, sp_ran="legacy"))
    sp = next(v for v in db.variants_of("night-01") if v.name == "sp")
    assert sp.path_status == "failed" and sp.status == "INCONCLUSIVE" and sp.probes is not None and sp.probes.models == [MODEL]
    db.engine.dispose()


def test_postgres_readers_create_no_schema_and_write_nothing(tmp_path, pg_url):
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("CREATE DATABASE history_empty"))
    admin.dispose()
    url = pg_url.rsplit("/", 1)[0] + "/history_empty"
    with pytest.raises(HistoryError, match=r"holds no evalpipe history \(it has no schema_version table\); "):
        open_history(url, tmp_path, access="read")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == [], "no schema was created"
    engine.dispose()
    open_history(url, tmp_path).record(write_night(tmp_path / "runs", 0))
    db = open_history(url, tmp_path, access="read")
    assert [r.run_id for r in db.runs()] == ["night-00"]
    with pytest.raises(sa.exc.InternalError, match="read-only transaction"):  # the server itself refuses
        db.pin_baseline("night-00")
    db.engine.dispose()
