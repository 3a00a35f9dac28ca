"""One migration runner for both engines: every migration names its SQLite and its
PostgreSQL form, each is applied once and recorded where earlier versions recorded it, and a
database left at any earlier migration opens and is brought up to date, on each engine."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from notifier.store import Store, migrations
from notifier.store.backend import Engine
from notifier.store.migrations import MIGRATIONS, Migrator
from notifier.store.postgres import PostgresEngine
from notifier.store.sqlite import SqliteEngine

from ..conftest import ROOT, Workspace

FIXTURES = ROOT / "tests" / "fixtures"


@contextmanager
def connected(ws: Workspace) -> Iterator[tuple[Engine, Migrator]]:
    """The workspace's database through its engine, connected but neither checked nor
    migrated (as an earlier version's open left it), and the runner of that engine."""
    engine: Engine
    if ws.url:
        engine, migrator = PostgresEngine._connect(ws.url), migrations.POSTGRES
    else:
        engine, migrator = SqliteEngine._connect(ws.db_file, fresh=False), migrations.SQLITE
    try:
        yield engine, migrator
    finally:
        engine.close()


def seed_m001_run(conn: Engine) -> None:
    """A paused run in m001's columns alone: a sent item (with its receipt), a pending one
    and a failed one, so that each later migration's back-fill has rows to fill."""
    conn.execute(
        "INSERT INTO runs (run_id, state, created_at, updated_at, batch_path, fingerprint, "
        "channel_snapshot, options, contract_version) VALUES ('r1', 'paused', "
        "'2026-01-01T00:00:00.000000+00:00', '2026-01-01T00:00:00.000000+00:00', 'b.csv', "
        "'sha256:f', '{{}}', '{{}}', '1')"
    )
    for seq, state in ((1, "sent"), (2, "pending"), (3, "failed")):
        conn.execute(
            "INSERT INTO items (run_id, seq, item_id, channel, target, payload, "
            "idempotency_key, intent_digest, state, updated_at) VALUES "
            "('r1', %(seq)s, %(item_id)s, 'outbox', 'a@example.com', '{{}}', %(key)s, "
            "%(digest)s, %(state)s, '2026-01-01T00:00:00.000000+00:00')",
            {
                "seq": seq,
                "item_id": str(seq),
                "key": f"key-{seq}",
                "digest": f"sha256:{seq:064x}",
                "state": state,
            },
        )
    conn.execute(
        "INSERT INTO receipts (idempotency_key, intent_digest, source, recorded_at) VALUES "
        "('key-1', %(digest)s, 'send', '2026-01-01T00:00:00.000000+00:00')",
        {"digest": f"sha256:{1:064x}"},
    )


def test_every_migration_names_both_forms_in_order() -> None:
    """m001, m002, … in order, none twice, each with a SQLite and a PostgreSQL form."""
    names = [m.name for m in MIGRATIONS]
    assert len(set(names)) == len(names)
    assert [name[:4] for name in names] == [f"m{i:03d}" for i in range(1, len(names) + 1)]
    assert all(m.sqlite and m.postgres for m in MIGRATIONS)


@pytest.mark.both_stores
@pytest.mark.parametrize("level", range(len(MIGRATIONS) + 1))
def test_a_database_at_every_earlier_migration_opens_up_to_date(ws: Workspace, level: int) -> None:
    """A database that an earlier version left after its first `level` migrations (with a run
    written at m001 and migrated since) opens: the rest are applied once each and recorded
    beside the earlier ones, the back-fills fill the old rows, and the runner then finds
    nothing left to do."""
    if level:
        with connected(ws) as (conn, migrator):
            conn.execute("BEGIN")
            assert migrator.apply(conn, MIGRATIONS[:1]) == ["m001_initial"]
            seed_m001_run(conn)  # the run as m001's code wrote it, then migrated with it
            assert migrator.apply(conn, MIGRATIONS[:level]) == [m.name for m in MIGRATIONS[1:level]]
            conn.execute("COMMIT")
    Store.open(ws.db, create=level == 0).close()

    with connected(ws) as (conn, migrator):
        assert migrator.applied(conn) == migrations.NAMES
        recorded = conn.execute(
            f"SELECT name, COUNT(*) FROM {migrator.table} GROUP BY name"
        ).fetchall()
        assert sorted(recorded) == sorted((m.name, 1) for m in MIGRATIONS)
        assert migrator.apply(conn) == []
    if not level:
        return
    with connected(ws) as (engine, _):
        fingerprint = migrations.stored_content_fingerprint(engine, "r1")
    assert ws.ledger.run().content_fingerprint == fingerprint
    assert ws.ledger.run_counts() == {"failed": 1, "pending": 1, "sent": 1}
    # Every item_id is its seq (a file without an id column): identity is the intent digest.
    assert ws.query("SELECT identity = intent_digest FROM items") == [(True,)] * 3


def test_sqlite_schema_text_is_what_earlier_versions_stored(ws: Workspace) -> None:
    """SQLite keeps each CREATE's text. A fresh file holds, to the byte, the texts that the
    code before this runner (sqlite-utils applying each migration) stored in the m005
    fixture, the record of migrations included; only `items`, `runs`, `events`, `workers`
    and `drafts` differ, by m006's, m011's, m013's, m015's and m018's columns."""

    def schema(path: Any) -> dict[tuple[str, str], str]:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql NOT NULL")
            return {(kind, name): sql for kind, name, sql in rows}
        finally:
            conn.close()

    old = FIXTURES / "m006-delivered-and-inflight.db"
    Store.open(ws.db_file, create=True).close()
    fresh = schema(ws.db_file)
    grown = {("table", name) for name in ("items", "runs", "events", "workers", "drafts")}
    shipped = {key: sql for key, sql in schema(old).items() if key not in grown}
    assert {key: fresh[key] for key in shipped} == shipped
    assert fresh[("index", "items_identity")].endswith("identity)\n")  # as shipped
    chain = ", audit_chain TEXT, audit_key_id TEXT)"
    assert (
        fresh[("table", "runs")]
        == schema(old)[("table", "runs")][:-1] + ", stop_cause TEXT" + chain
    )
    assert fresh[("table", "events")] == schema(old)[("table", "events")].replace(
        "detail TEXT,", "detail TEXT, prev_hash TEXT, hash TEXT,"
    )
    workers = schema(old)[("table", "workers")]
    assert fresh[("table", "workers")] == workers[:-1] + ", pid_space TEXT)"
    drafts = schema(old)[("table", "drafts")]
    assert fresh[("table", "drafts")] == drafts.replace(
        "drafted_at TEXT,", "drafted_at TEXT, source_digest TEXT,"
    )
    # And a file migrated from that fixture ends up the same as a fresh one.
    shutil.copy(old, ws.path / "old.db")
    Store.open(ws.path / "old.db").close()
    assert schema(ws.path / "old.db") == fresh
