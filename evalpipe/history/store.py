"""The history database: every run and night, with what night-over-night judging needs.

The run directories are the source of truth; the database is an index of them that
`evalpipe history import RUN_DIR...` can rebuild at any time. SQLite by default (one
file under the output root), any SQLAlchemy URL otherwise (PostgreSQL for CI machines
that are thrown away after each night).

What one recorded run keeps, per variant:
- the components it ran on (versions and commits of vllm, vllm-ascend, torch,
  torch_npu, CANN, evalpipe, plus the labels CI passes with ``--component``) and its
  settings (env, engine args), so a change can be traced to what changed with it;
- its comparison with the reference (status, every gate's result, token summaries);
- what ran: the path probes' summary of its engine processes (model and layer classes,
  switches, calls, collectives per forward pass) and whether its comparison verified
  the paths (``path_status``), so a night that silently ran another path shows;
- per task x metric the mean, standard error and n, and the per-item correctness,
  packed (one bit per item for 0/1 metrics) against the task's item set, which is
  stored once. The per-item values are what makes night-over-night tests paired.

Migrations are numbered; a database written by a newer evalpipe is refused.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from evalpipe.documents.history_rows import (
    TOKEN_MEASURES,
    GatePoint,
    RecordedRun,
    RecordedVariant,
    ScorePoint,
    TaskVerdictPoint,
    TokenPoint,
)
from evalpipe.documents.nightly_doc import NightlyDocument
from evalpipe.history import HistoryError
from evalpipe.history.records import ItemScores, RunRecord, decode_items, encode_items, read_run
from evalpipe.redact import redact_text
from evalpipe.rundir import artifacts

DEFAULT_FILE = "history.sqlite"


# ---------------------------------------------------------------------------
# schema and migrations
# ---------------------------------------------------------------------------

metadata = sa.MetaData()
# A column added by a later migration says which one in its ``info``: the migration that
# creates a table creates it as it was then, so every database, new or upgraded, takes
# the same steps and ends with the same schema.
SINCE = "since_schema"

schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("description", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.Float, nullable=False),
)
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(200), nullable=False, unique=True),
    sa.Column("kind", sa.String(20), nullable=False),  # run | nightly
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("recorded_at", sa.Float, nullable=False),
    sa.Column("config_path", sa.String(500)),
    sa.Column("config_hash", sa.String(64)),
    sa.Column("code_version", sa.String(100)),
    sa.Column("model", sa.String(500)),
    sa.Column("model_fingerprint", sa.String(64)),
    sa.Column("task_selector", sa.String(200)),
    sa.Column("status", sa.String(20)),
    sa.Column("verdict", sa.String(20)),
    sa.Column("reference", sa.String(200)),
    sa.Column("aa_variant", sa.String(200)),
    sa.Column("hardware", sa.JSON),
    sa.Column("run_dir", sa.String(1000)),
    # filled by `nightly` after judging: PASS | INCONCLUSIVE | REGRESSION | FAILED, and the evidence
    sa.Column("nightly_status", sa.String(20)),
    sa.Column("baseline_run_id", sa.String(200)),
    sa.Column("judgement", sa.JSON),
)
variants = sa.Table(
    "variants", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_pk", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("role", sa.String(20), nullable=False),  # reference | aa | variant
    sa.Column("status", sa.String(20)),  # its comparison with the reference (None: reference)
    sa.Column("exit_code", sa.Integer),
    sa.Column("components", sa.JSON),
    sa.Column("settings", sa.JSON),
    # what ran: the manifest's path-probe summary (None: a run from before the probes) and
    # the path status of its comparison ("verified", "failed", "same_code", "not_recorded")
    sa.Column("probes", sa.JSON, info={SINCE: 2}),
    sa.Column("path_status", sa.String(20), info={SINCE: 2}),
)
gate_results = sa.Table(
    "gate_results", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("variant_pk", sa.Integer, sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("gate", sa.String(100), nullable=False),
    sa.Column("task", sa.String(200)),
    sa.Column("metric", sa.String(200)),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("measured", sa.Float),
    sa.Column("threshold", sa.Float),
)
item_sets = sa.Table(
    "item_sets", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("digest", sa.String(64), nullable=False, unique=True),
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("item_keys", sa.LargeBinary, nullable=False),  # zlib(JSON [[doc_id, repeat, prompt_hash], ...])
)
scores = sa.Table(
    "scores", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("variant_pk", sa.Integer, sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("metric", sa.String(200), nullable=False),
    sa.Column("mean", sa.Float),
    sa.Column("se", sa.Float),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("item_set_pk", sa.Integer, sa.ForeignKey("item_sets.id"), nullable=False),
    sa.Column("encoding", sa.String(8), nullable=False),  # bits | f32
    sa.Column("item_values", sa.LargeBinary, nullable=False),
)
token_summaries = sa.Table(
    "token_summaries", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("variant_pk", sa.Integer, sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("source", sa.String(10), nullable=False),  # free | teacher
    *(sa.Column(m, sa.Float) for m in TOKEN_MEASURES),
    sa.Column("n_samples", sa.Integer),
)
task_verdicts = sa.Table(
    "task_verdicts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("variant_pk", sa.Integer, sa.ForeignKey("variants.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("outputs_status", sa.String(20)),
)
baselines = sa.Table(
    "baselines", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("variant", sa.String(200)),  # NULL: every variant
    sa.Column("run_id", sa.String(200), nullable=False),
    sa.Column("pinned_at", sa.Float, nullable=False),
)

V1_TABLES = (runs, variants, gate_results, item_sets, scores, token_summaries, baselines)
V3_TABLES = (task_verdicts,)
TABLES = V1_TABLES + V3_TABLES  # every table (a migration that adds columns looks for them here)


def _since(column: sa.Column) -> int:
    return int(column.info.get(SINCE, 1))


def create_tables_as_of(conn: Connection, tables: Sequence[sa.Table], version: int) -> None:
    """CREATE TABLE (and its indexes) of each table that does not exist yet, with only the
    columns schema ``version`` had."""
    inspector = sa.inspect(conn)
    for table in tables:
        if inspector.has_table(table.name):
            continue
        ddl = sa.schema.CreateTable(table)
        ddl.columns = [c for c in ddl.columns if _since(c.element) <= version]
        conn.execute(ddl)
        for index in table.indexes:
            if all(_since(c) <= version for c in index.columns):
                conn.execute(sa.schema.CreateIndex(index))


def add_columns_of(conn: Connection, version: int) -> None:
    """ALTER TABLE ... ADD COLUMN for every column migration ``version`` adds (nullable,
    no constraint: SQLite and PostgreSQL add such a column in place, without a rewrite)."""
    for table in TABLES:
        for column in table.columns:
            if _since(column) == version:
                spec = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
                conn.execute(sa.text(f"ALTER TABLE {conn.dialect.identifier_preparer.format_table(table)} ADD COLUMN {spec}"))


@dataclass(frozen=True)
class Migration:
    version: int
    description: str

    def apply(self, conn: Connection) -> None:
        if self.version == 1:
            create_tables_as_of(conn, V1_TABLES, 1)
        elif self.version == 3:
            create_tables_as_of(conn, V3_TABLES, 3)
        else:
            add_columns_of(conn, self.version)


# A schema change appends a Migration: new columns name it in their info (SINCE), new
# tables get their own step in `apply`. An existing database is brought forward one step
# at a time, each step in its own transaction.
MIGRATIONS = (
    Migration(1, "runs, variants, gates, scores with per-item values, token summaries, baselines"),
    Migration(2, "variants: what ran (the manifest's path-probe summary) and the path status of the comparison"),
    Migration(3, "task_verdicts: each task's own verdict in a variant's comparison (a scenario's series)"),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int:
    if not sa.inspect(conn).has_table("schema_version"):
        return 0
    return int(conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar() or 0)


def _newer_refused(found: int, where: str) -> None:
    if found > SCHEMA_VERSION:
        raise HistoryError(
            f"history database {where} has schema version {found}, newer than this evalpipe's {SCHEMA_VERSION}; "
            "upgrade evalpipe or use another --history."
        )


def migrate(engine: Engine, where: str) -> int:
    """Bring the schema to SCHEMA_VERSION. Several processes may open a new history at once
    (nights running side by side): a step another one applied first is taken as done."""
    try:
        with engine.begin() as conn:
            schema_version.create(conn, checkfirst=True)
    except sa.exc.DBAPIError:
        if not sa.inspect(engine).has_table(schema_version.name):
            raise
    with engine.begin() as conn:
        found = current_version(conn)
    _newer_refused(found, where)
    for step in MIGRATIONS:
        if step.version <= found:
            continue
        try:
            with engine.begin() as conn:
                step.apply(conn)
                conn.execute(schema_version.insert().values(version=step.version, description=step.description,
                                                            applied_at=time.time()))
        except sa.exc.DBAPIError:
            # another process's step: SQLite's driver commits its DDL before the version row,
            # so that row may follow a moment later
            deadline = time.monotonic() + 30
            while True:
                with engine.begin() as conn:
                    if current_version(conn) >= step.version:
                        break
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return SCHEMA_VERSION


def default_url(output_root: Path) -> str:
    return f"sqlite:///{Path(output_root).resolve() / DEFAULT_FILE}"


def shown_url(url: str) -> str:
    """The URL without its password (evalpipe.redact's rule, the one every output uses),
    for messages, reports and the dashboard."""
    try:
        sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return "<unparseable URL>"
    return redact_text(url)


class History:
    """One history database. Open with :func:`open_history`."""

    def __init__(self, engine: Engine, url: str, version: int = SCHEMA_VERSION):
        self.engine = engine
        self.url = url
        self.where = shown_url(url)
        # the schema it has: one opened to read is not migrated, and its queries ask only
        # for the columns that version has (the others read as None)
        self.version = version

    # -- writing ------------------------------------------------------------

    def record(self, run_dir: Path, *, kind: str | None = None, labels: dict[str, str] | None = None) -> str:
        """Record (or record again, replacing) one run directory; returns its run id."""
        rec = read_run(run_dir, kind=kind, labels=labels)
        self.write(rec)
        return rec.run.run_id

    def write(self, rec: RunRecord) -> None:
        with self.engine.begin() as conn:
            old = conn.execute(sa.select(runs.c.id, runs.c.nightly_status, runs.c.baseline_run_id, runs.c.judgement)
                               .where(runs.c.run_id == rec.run.run_id)).first()
            row = run_values(rec.run)
            if old is not None:
                if rec.run.judgement is None:
                    # A re-import keeps the night's judgement (it is not in the run directory's
                    # artifacts unless nightly.json is; see records.judgement_of).
                    row.update(nightly_status=old.nightly_status, baseline_run_id=old.baseline_run_id, judgement=old.judgement)
                self._delete(conn, old.id)
            run_pk = _inserted_pk(conn.execute(runs.insert().values(**row, recorded_at=time.time())))
            for v in rec.variants:
                vpk = _inserted_pk(conn.execute(variants.insert().values(run_pk=run_pk, **v.row.model_dump(mode="json"))))
                score_rows = []
                for s in v.scores:
                    encoding, data = encode_items(s.values)
                    score_rows.append({
                        "variant_pk": vpk, "task": s.task, "metric": s.metric, "mean": s.mean, "se": s.se,
                        "n": int(s.values.size), "item_set_pk": self._item_set(conn, s), "encoding": encoding, "item_values": data,
                    })
                if score_rows:
                    conn.execute(scores.insert(), score_rows)
                if v.tokens:
                    conn.execute(token_summaries.insert(), [{"variant_pk": vpk, **t.model_dump(mode="json")} for t in v.tokens])
                if v.gates:
                    conn.execute(gate_results.insert(), [{"variant_pk": vpk, **g.model_dump(mode="json")} for g in v.gates])
                if v.task_verdicts:
                    conn.execute(task_verdicts.insert(), [{"variant_pk": vpk, **t.model_dump(mode="json")} for t in v.task_verdicts])

    def write_many(self, records: Iterable[RunRecord]) -> int:
        n = 0
        for rec in records:
            self.write(rec)
            n += 1
        return n

    def _item_set(self, conn: Connection, s: ItemScores) -> int:
        digest = s.digest
        pk = conn.execute(sa.select(item_sets.c.id).where(item_sets.c.digest == digest)).scalar()
        if pk is None:
            keys = zlib.compress(json.dumps([list(k) for k in s.keys]).encode())
            pk = _inserted_pk(conn.execute(item_sets.insert().values(digest=digest, task=s.task, n=len(s.keys), item_keys=keys)))
        return int(pk)

    def _delete(self, conn: Connection, run_pk: int) -> None:
        vpks = [r.id for r in conn.execute(sa.select(variants.c.id).where(variants.c.run_pk == run_pk))]
        if vpks:
            for table in (scores, token_summaries, gate_results, task_verdicts):
                conn.execute(table.delete().where(table.c.variant_pk.in_(vpks)))
            conn.execute(variants.delete().where(variants.c.run_pk == run_pk))
        conn.execute(runs.delete().where(runs.c.id == run_pk))

    def set_judgement(self, night: NightlyDocument) -> None:
        """Store a night's judgement with its run."""
        with self.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.run_id == night.run_id).values(
                nightly_status=night.status.value, baseline_run_id=night.baseline, judgement=night.judgement(),
            ))

    def pin_baseline(self, run_id: str, variant: str | None = None) -> None:
        self.run(run_id)  # HistoryError for a run the history does not hold
        if variant is not None and variant not in {v.name for v in self.variants_of(run_id)}:
            names = ", ".join(v.name for v in self.variants_of(run_id))
            raise HistoryError(f"run {run_id} has no variant {variant!r} (it has {names}); pass one of them to --variant.")
        with self.engine.begin() as conn:
            conn.execute(baselines.insert().values(variant=variant, run_id=run_id, pinned_at=time.time()))

    # -- reading ------------------------------------------------------------

    def runs(self, kind: str | None = None, config_hash: str | None = None) -> list[RecordedRun]:
        """Recorded runs, oldest first."""
        q = sa.select(runs).order_by(runs.c.started_at, runs.c.id)
        if kind:
            q = q.where(runs.c.kind == kind)
        if config_hash:
            q = q.where(runs.c.config_hash == config_hash)
        with self.engine.connect() as conn:
            return [_recorded_run(r._mapping) for r in conn.execute(q)]

    def run(self, run_id: str) -> RecordedRun:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).first()
        if row is None:
            raise HistoryError(f"no run {run_id!r} in the history {self.where}; `evalpipe history list` shows the recorded ones.")
        return _recorded_run(row._mapping)

    def variants_of(self, run_id: str) -> list[RecordedVariant]:
        """The variants of a recorded run, in the order they were recorded; columns a database
        opened to read does not have yet (see :attr:`version`) read as their defaults."""
        present = [c for c in variants.columns if _since(c) <= self.version and c.name not in ("id", "run_pk")]
        q = (sa.select(*present).join(runs, variants.c.run_pk == runs.c.id).where(runs.c.run_id == run_id)
             .order_by(variants.c.id))
        with self.engine.connect() as conn:
            return [RecordedVariant.model_validate(_without_nulls(r._mapping)) for r in conn.execute(q)]

    def score_rows(self, run_ids: Sequence[str] | None = None, *, with_items: bool = False) -> list[ScorePoint]:
        """One row per run x variant x task x metric (with the decoded per-item values on request)."""
        cols = [runs.c.run_id, runs.c.started_at, variants.c.name.label("variant"), variants.c.role,
                scores.c.task, scores.c.metric, scores.c.mean, scores.c.se, scores.c.n, scores.c.item_set_pk]
        if with_items:
            cols += [scores.c.encoding, scores.c.item_values]
        q = (sa.select(*cols).select_from(scores.join(variants, scores.c.variant_pk == variants.c.id)
                                          .join(runs, variants.c.run_pk == runs.c.id))
             .order_by(runs.c.started_at, runs.c.id))
        if run_ids is not None:
            q = q.where(runs.c.run_id.in_(list(run_ids)))
        with self.engine.connect() as conn:
            out = []
            for r in conn.execute(q):
                row = dict(r._mapping)
                if with_items:
                    row["values"] = decode_items(row.pop("encoding"), row.pop("item_values"), row["n"])
                out.append(ScorePoint.model_validate(row))
            return out

    def token_rows(self, run_ids: Sequence[str] | None = None) -> list[TokenPoint]:
        q = (sa.select(runs.c.run_id, runs.c.started_at, variants.c.name.label("variant"), variants.c.role,
                       token_summaries.c.task, token_summaries.c.source, *(token_summaries.c[m] for m in TOKEN_MEASURES),
                       token_summaries.c.n_samples)
             .select_from(token_summaries.join(variants, token_summaries.c.variant_pk == variants.c.id)
                          .join(runs, variants.c.run_pk == runs.c.id))
             .order_by(runs.c.started_at, runs.c.id))
        if run_ids is not None:
            q = q.where(runs.c.run_id.in_(list(run_ids)))
        with self.engine.connect() as conn:
            return [TokenPoint.model_validate(dict(r._mapping)) for r in conn.execute(q)]

    def task_verdict_rows(self, run_ids: Sequence[str] | None = None) -> list[TaskVerdictPoint]:
        """Each task's own verdict of every recorded comparison (of the given runs), oldest run
        first: a scenario's series. A database from before task verdicts (read, not upgraded) has none."""
        if self.version < 3:
            return []
        q = (sa.select(runs.c.run_id, runs.c.started_at, variants.c.name.label("variant"), variants.c.role,
                       task_verdicts.c.task, task_verdicts.c.status, task_verdicts.c.outputs_status)
             .select_from(task_verdicts.join(variants, task_verdicts.c.variant_pk == variants.c.id)
                          .join(runs, variants.c.run_pk == runs.c.id))
             .order_by(runs.c.started_at, runs.c.id, task_verdicts.c.id))
        if run_ids is not None:
            q = q.where(runs.c.run_id.in_(list(run_ids)))
        with self.engine.connect() as conn:
            return [TaskVerdictPoint.model_validate(dict(r._mapping)) for r in conn.execute(q)]

    def gate_rows(self, run_id: str | Sequence[str]) -> list[GatePoint]:
        """Gate results of one run (or of several), in the order they were recorded."""
        ids = [run_id] if isinstance(run_id, str) else list(run_id)
        q = (sa.select(runs.c.run_id, variants.c.name.label("variant"), gate_results.c.gate, gate_results.c.task, gate_results.c.metric,
                       gate_results.c.status, gate_results.c.measured, gate_results.c.threshold)
             .select_from(gate_results.join(variants, gate_results.c.variant_pk == variants.c.id)
                          .join(runs, variants.c.run_pk == runs.c.id))
             .where(runs.c.run_id.in_(ids)).order_by(gate_results.c.id))
        with self.engine.connect() as conn:
            return [GatePoint.model_validate(dict(r._mapping)) for r in conn.execute(q)]

    def item_keys(self, item_set_pk: int) -> list[tuple[int, int, str]]:
        with self.engine.connect() as conn:
            data = conn.execute(sa.select(item_sets.c.item_keys).where(item_sets.c.id == item_set_pk)).scalar()
        return [tuple(k) for k in json.loads(zlib.decompress(data))] if data is not None else []

    def pinned_baseline(self, variant: str) -> str | None:
        """The latest pin for this variant (or for every variant), else None."""
        q = (sa.select(baselines.c.run_id).where(sa.or_(baselines.c.variant == variant, baselines.c.variant.is_(None)))
             .order_by(baselines.c.pinned_at.desc(), baselines.c.id.desc()).limit(1))
        with self.engine.connect() as conn:
            return conn.execute(q).scalar()

    def export_rows(self) -> list[dict[str, Any]]:
        """A flat table for people and other tools: run x variant x task x metric, with the
        run's verdicts and the variant's components as JSON text."""
        meta = {r.run_id: r for r in self.runs()}
        comps = {(run_id, v.name): v for run_id in meta for v in self.variants_of(run_id)}
        rows = []
        for s in self.score_rows():
            r, v = meta[s.run_id], comps[(s.run_id, s.variant)]
            rows.append({
                "run_id": s.run_id, "kind": r.kind, "started_at": r.started_at, "config_hash": r.config_hash,
                "model_fingerprint": r.model_fingerprint, "run_verdict": _text(r.verdict), "nightly_status": _text(r.nightly_status),
                "variant": s.variant, "role": s.role, "variant_status": _text(v.status), "path_status": _text(v.path_status),
                "task": s.task, "metric": s.metric, "mean": s.mean, "se": s.se, "n": s.n,
                "components": json.dumps(v.components, sort_keys=True),
            })
        return rows

    def size_bytes(self) -> int | None:
        url = sa.engine.make_url(self.url)
        if url.get_backend_name() == "sqlite" and url.database:
            return Path(url.database).stat().st_size
        return None


def run_values(run: RecordedRun) -> dict[str, Any]:
    """The runs table's columns of a recorded run (the judgement as its JSON column holds it)."""
    row = run.model_dump(mode="json", exclude={"recorded_at", "judgement"})
    row["judgement"] = None if run.judgement is None else run.judgement.judgement()
    return row


def _without_nulls(mapping: Any) -> dict[str, Any]:
    """A row's columns without its NULLs, so that each reads as its model's default."""
    return {k: v for k, v in mapping.items() if v is not None}


def _recorded_run(mapping: Any) -> RecordedRun:
    row = _without_nulls(mapping)
    row.pop("id")
    if "judgement" in row:
        row["judgement"] = NightlyDocument.from_judgement(row["judgement"])
    return RecordedRun.model_validate(row)


def _text(value: str | None) -> str | None:
    """An enum's value (or None) for the flat export."""
    return None if value is None else str(value)


def _inserted_pk(result: sa.CursorResult[Any]) -> Any:
    """The new row's primary key. SQLAlchemy types it Optional; a single-row insert without
    RETURNING, as every insert here is, always reports one."""
    key = result.inserted_primary_key
    if key is None:
        raise RuntimeError("a single-row insert reported no primary key")
    return key[0]


# How a command uses the history. "create": it records runs (run, nightly, history import),
# so the database and its directory are created and migrated as needed. "update": it
# changes an existing one (baseline set): migrated, never created. "read": it only reads
# (history list, show, export): never created, migrated or written; SQLite is opened
# read-only and every PostgreSQL transaction is read-only.
Access = Literal["create", "update", "read"]
WHAT_RECORDS = "`evalpipe run`, `evalpipe nightly` and `evalpipe history import RUN_DIR...` create it"


def open_history(url: str | None, output_root: Path, *, access: Access = "create") -> History:
    """Open the history at ``url``, default ``<output_root>/history.sqlite``, for ``access``
    (see :data:`Access`); one-sentence HistoryError when it cannot."""
    url = url or default_url(output_root)
    where = shown_url(url)
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise HistoryError(f"history URL {redact_text(url)!r} is not an SQLAlchemy URL; use e.g. sqlite:///path/history.sqlite or postgresql+psycopg://user@host/db.") from None
    socket_only = _names_no_server(parsed)
    if socket_only and not parsed.database:
        # libpq would try a local Unix socket and report that socket's absence
        raise HistoryError(f"history URL {where!r} names no database server and no database; "
                           "write it as postgresql+psycopg://USER@HOST[:PORT]/DATABASE.")
    sqlite_file = _sqlite_file(parsed)
    if sqlite_file is not None:
        if access == "create":
            sqlite_file.parent.mkdir(parents=True, exist_ok=True)
        elif not sqlite_file.is_file():
            raise HistoryError(f"there is no history at {where} ({sqlite_file} does not exist); {WHAT_RECORDS}, "
                               "or pass the --history / --output of an existing one.")
    try:
        engine = _engine(url, parsed, sqlite_file, read_only=access == "read")
        version = _readable_version(engine, where) if access == "read" else migrate(engine, where)
    except HistoryError:
        raise
    except ModuleNotFoundError as err:
        raise HistoryError(f"history {where} needs the Python package {err.name!r}; install it (PostgreSQL: pip install 'psycopg[binary]').") from None
    except sa.exc.SQLAlchemyError as err:
        reason = redact_text(str(getattr(err, "orig", None) or err).strip().splitlines()[0])
        fix = ("the URL names no host, so a local Unix socket was tried: add the server, postgresql+psycopg://USER@HOST/DATABASE"
               if socket_only else "check --history / the config's nightly.history")
        raise HistoryError(f"cannot open the history database {where} ({reason}); {fix}.") from None
    return History(engine, url, version)


def _names_no_server(url: sa.engine.URL) -> bool:
    """A PostgreSQL URL with no host (nor PGHOST): libpq then tries a local Unix socket."""
    return url.get_backend_name() == "postgresql" and not (url.host or "host" in url.query or os.environ.get("PGHOST"))


def _sqlite_file(url: sa.engine.URL) -> Path | None:
    """The file of an SQLite URL (None: another database, or SQLite in memory)."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def _engine(url: str, parsed: sa.engine.URL, sqlite_file: Path | None, *, read_only: bool) -> Engine:
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        # a database server that does not answer must not hold a finished run for minutes
        connect_args["connect_timeout"] = 10
        if read_only:
            connect_args["options"] = "-c default_transaction_read_only=on"
    if read_only and sqlite_file is not None:
        uri = f"{sqlite_file.resolve().as_uri()}?mode=ro"  # mode=ro: SQLite itself refuses any write
        return sa.create_engine(url, future=True, creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False))
    if sqlite_file is not None:
        # several nights recording at once (`nightly -c A -c B` on a cluster) take turns
        connect_args["timeout"] = 120
    return sa.create_engine(url, future=True, connect_args=connect_args)


def _readable_version(engine: Engine, where: str) -> int:
    """The schema version of a history opened to read; one that holds none is refused."""
    with engine.connect() as conn:
        found = current_version(conn)
    if found == 0:
        raise HistoryError(f"{where} holds no evalpipe history (it has no schema_version table); {WHAT_RECORDS}, "
                           "or pass the --history of the database they record into.")
    _newer_refused(found, where)
    return found


EXPORT_FORMATS = ("csv", "parquet")


def check_export_format(fmt: str) -> None:
    """Refuse an unknown export format (before any history is opened)."""
    if fmt not in EXPORT_FORMATS:
        raise HistoryError(f"export format {fmt!r} is not one of {', '.join(EXPORT_FORMATS)}; pass --format csv or --format parquet.")


def export(history: History, path: Path, fmt: str) -> int:
    """Write :meth:`History.export_rows` as CSV or Parquet (atomically); returns the row count."""
    check_export_format(fmt)
    rows = history.export_rows()
    table = pa.Table.from_pylist(rows) if rows else pa.table({"run_id": pa.array([], pa.string())})
    sink = pa.BufferOutputStream()
    if fmt == "csv":
        pacsv.write_csv(table, sink)
    else:
        pq.write_table(table, sink)
    artifacts.write_bytes(Path(path), sink.getvalue().to_pybytes())
    return len(rows)
