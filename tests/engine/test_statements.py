"""The statement catalogue's compiled forms: a bounded number kept, hints
current after a migration on open, and a pipelined fence that times out leaving its
connection usable."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from notifier.store import Store, statements
from notifier.store.exceptions import StorageFailed
from notifier.store.sqlite import SQLITE, SqliteEngine
from notifier.store.statements import ledger, suppressions
from notifier.store.statements import queries as q

from ..conftest import ROOT, Workspace
from .test_pg_concurrent_writes import pg_url, plan, worker

__all__ = ["pg_url"]  # the fixture, imported to be used here


@pytest.mark.timeout(60)
def test_fence_lock_timeout_is_storage_failed_and_next_write_works(
    ws: Workspace, pg_url: str
) -> None:
    """A worker's pipelined fence that waits past lock_timeout (another session holds its
    lease row) fails as StorageFailed, rolled back, and the same connection writes again."""
    plan(ws, pg_url, "one", "batch.csv", 1)
    a, version = worker(pg_url, "one", "worker-a")
    a.engine.execute("SET lock_timeout = '300ms'")
    try:
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT 1 FROM workers WHERE worker_id = 'worker-a' FOR UPDATE")
            with pytest.raises(StorageFailed, match="locked by another session"):
                a.ledger.claim("one", version, 2)
        assert [i.seq for i in a.ledger.claim("one", version, 2)] == [1, 2]
    finally:
        a.close()


def test_index_hints_survive_the_migration_that_makes_the_indexes(ws: Workspace) -> None:
    """An SQLite file older than m004, opened read-write (migrated on open), gets the INDEXED
    BY hints of the partial indexes m004 just made, in the same process."""
    shutil.copy(ROOT / "tests" / "fixtures" / "m001-inflight-run.db", ws.db_file)
    store = Store.open(ws.db_file)
    try:
        indexes = "SELECT name FROM sqlite_master WHERE type = 'index'"
        assert "items_retried" in {r[0] for r in store.engine.execute(indexes)}  # m004 ran
        assert store.engine.indexed("items_pending_channel") == "INDEXED BY items_pending_channel"
        assert isinstance(store.engine, SqliteEngine)
        assert "INDEXED BY items_retried" in store.engine._compile(q.PENDING_KINDS)
    finally:
        store.close()


def test_claim_shapes_do_not_accumulate_with_the_number_of_held_items(tmp_path: Path) -> None:
    """Claims excluding 0..N-1 held items (a worker's in-process backoff holds, which grow
    with the retried items) leave a bounded number of compiled statements behind, not one
    per distinct count (each ~12 bytes per held item: quadratic memory)."""
    engine = SqliteEngine.open(tmp_path / "r.db", create=True)
    try:
        on_list = suppressions.on_list(SQLITE)
        for held in range(600):
            params = {"run_id": "r", "at": "2026-01-01T00:00:00Z", "limit": 5}
            params.update(statements.bound("held", range(held)))
            engine.execute(ledger.claimable(on_list, 0, held), params).fetchall()
        assert len(engine._compiled) < 300
    finally:
        engine.close()
