"""A statement of notifier's that an administrator cancels on the server (pg_cancel_backend,
or a statement_timeout set for it) is a storage failure that says so: rolled back, run the
command again. Never "locked by another session for longer than 10 s", which would send the
operator looking for a lock that nobody holds. Here the write waits on a lock the test holds,
so that it is under way when the administrator's cancel comes; the lock is held far less
than the 10 s a lock waits, so only the cancel can end the wait."""

from __future__ import annotations

import psycopg
import pytest

from notifier.store import Store
from notifier.store.exceptions import StorageFailed
from notifier.store.postgres import PostgresEngine

from ..conftest import Workspace
from .test_pg_concurrent_writes import (
    BOUND_S,
    in_thread,
    pg_url,
    plan,
    until,
    waiting_on_a_lock,
)

__all__ = ["pg_url"]  # the fixture, imported to be used here


@pytest.mark.timeout(60)
def test_an_administrators_cancel_is_named_never_a_lock_held_by_another_session(
    ws: Workspace, pg_url: str
) -> None:
    plan(ws, pg_url, "r1", "batch.csv", 1)  # awaiting approval
    store = Store.open(pg_url)
    assert isinstance(store.engine, PostgresEngine)
    pid = store.engine.raw.info.backend_pid
    try:
        with psycopg.connect(pg_url) as holder:
            holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            writer, raised = in_thread(lambda: store.ledger.request_cancel("r1"))
            assert until(lambda: waiting_on_a_lock(pg_url, store)), "never waited on the lock"
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
            writer.join(BOUND_S)
            holder.rollback()
    finally:
        store.close()
    assert len(raised) == 1 and isinstance(raised[0], StorageFailed), raised
    said = str(raised[0])
    assert "cancel" in said and "administrator" in said, said
    assert "locked by another session" not in said, said
