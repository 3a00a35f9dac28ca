"""The statement catalogue's compiled forms: a bounded number kept, hints
current after a migration on open, a group commit's statements padded to a few sizes (the
padding writing nothing), and a pipelined fence that times out leaving its connection
usable."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifier.engine.membership import holder_alive
from notifier.store import Store, statements
from notifier.store.exceptions import StorageFailed
from notifier.store.sqlite import SQLITE, SqliteEngine
from notifier.store.statements import ledger, suppressions
from notifier.store.statements import queries as q

from ..conftest import ROOT, Workspace, make_rows
from .test_pg_concurrent_writes import acks, pg_url, plan, worker

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
        assert "INDEXED BY items_retried" in store.engine._compile(q.PENDING_KINDS)[0]
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


def leased(ws: Workspace, run_id: str) -> tuple[Store, int]:
    """A store working the planned run `run_id` under a worker lease of its own, as the
    pipeline's committer does (its group commits: Ledger.step)."""
    store = Store.open(ws.db).for_worker("worker-a")
    owner = {"host": "host-a", "pid": 1, "started": None, "token": "worker-a"}
    return store, store.leases.join_run(run_id, owner, 60, holder_alive)


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_group_commit_of_three_sends_the_statements_written_for_four(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim of 3 and the answers of 3 are sent as statements written for 4 rows (so that
    every size shares one of a few prepared statements: statements.padded), and the padding
    row moves no item and writes no attempt or receipt."""
    plan(ws, str(ws.db), "one", "batch.csv", 1)
    store, version = leased(ws, "one")
    sent: list[str] = []
    real = store.engine.execute

    def spied(statement: str, params: Any = None) -> Any:
        sent.append(statement)
        return real(statement, params)

    monkeypatch.setattr(store.engine, "execute", spied)
    try:
        claimed = store.ledger.claim("one", version, 3)
        claim_sent, sent[:] = list(sent), []
        store.ledger.step("one", version, acks([i.seq for i in claimed]), 0)
    finally:
        store.close()
    assert [i.seq for i in claimed] == [1, 2, 3]
    assert any("%(seq3)s" in s for s in claim_sent), "the claim of 3 written for 4"
    assert not any("%(seq4)s" in s for s in claim_sent), "for 4, not more"
    assert any("%(receipt3)s" in s for s in sent), "the answers of 3 written for 4"
    assert not any("%(receipt4)s" in s for s in sent), "for 4, not more"
    read = ws.ledger
    assert [(a.seq, a.n) for a in read.attempts(run_id="one")] == [(1, 1), (2, 1), (3, 1)]
    assert len(read.receipts()) == 3
    assert read.state_counts("one") == {"sent": 3, "pending": 9}


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_group_commits_of_every_size_up_to_nine_and_of_seventeen_write_exactly_their_rows(
    ws: Workspace,
) -> None:
    """Group commits of 1 to 9 and of 17 (written for 24 rows) claims and answers, each size
    six times (past the five uses
    after which psycopg prepares a statement): each claimed item gets one attempt and one
    start event, each answer one receipt and one ack event, and the run's counters agree
    with its items; the padding writes nothing anywhere."""
    sizes = [k for k in [*range(1, 10), 17] for _ in range(6)]
    ws.write_csv("batch.csv", make_rows(sum(sizes) + 5))
    done = ws.invoke("send", "batch.csv", "--run-id", "one", "--require-approval")
    assert done.exit_code in (0, 3), done.output
    store, version = leased(ws, "one")
    try:
        held: list[int] = []
        for k in sizes:
            claimed = store.ledger.step("one", version, acks(held), k)
            assert len(claimed) == k
            held = [i.seq for i in claimed]
        store.ledger.step("one", version, acks(held), 0)
    finally:
        store.close()
    claimed_n = sum(sizes)
    read = ws.ledger
    assert [(a.seq, a.n) for a in read.attempts(run_id="one")] == [
        (s, 1) for s in range(1, claimed_n + 1)
    ]
    assert read.receipt_count() == claimed_n
    assert len(read.events("start", "one")) == len(read.events("ack", "one")) == claimed_n
    assert read.state_counts("one") == {"sent": claimed_n, "pending": 5}
    assert read.run_counts("one") == {"sent": claimed_n, "pending": 5}
