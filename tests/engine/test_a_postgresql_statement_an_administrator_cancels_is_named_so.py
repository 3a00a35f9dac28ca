"""A statement of notifier's that an administrator cancels on the server (pg_cancel_backend,
or a statement_timeout set for it) is a storage failure that says so: rolled back, run the
command again. Never "locked by another session for longer than 10 s", which would send the
operator looking for a lock that nobody holds. Here the write waits on a lock the test holds,
so that it is under way when the administrator's cancel comes; the lock is held far less
than the 10 s a lock waits, so only the cancel can end the wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner

from notifier.cli import cli
from notifier.store import Store
from notifier.store.exceptions import StorageFailed
from notifier.store.postgres import PostgresEngine

from ..conftest import Workspace, make_rows
from ..support.postgres import postgres_schema

BOUND_S = 20.0


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    with postgres_schema(postgres_server) as url:
        yield url


def _waiting_on_a_lock(url: str, pid: int) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.timeout(60)
def test_an_administrators_cancel_is_named_never_a_lock_held_by_another_session(
    ws: Workspace, pg_url: str
) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    planned = CliRunner().invoke(
        cli, ["--db", pg_url, "send", "batch.csv", "--run-id", "r1", "--require-approval"]
    )
    assert planned.exit_code in (0, 3), planned.output  # awaiting approval
    store = Store.open(pg_url)
    assert isinstance(store.engine, PostgresEngine)
    pid = store.engine.raw.info.backend_pid
    raised: list[BaseException] = []

    def cancel() -> None:
        try:
            store.ledger.request_cancel("r1")
        except BaseException as exc:  # what the write raised, for the test to read
            raised.append(exc)

    try:
        with psycopg.connect(pg_url) as holder:
            holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            writer = threading.Thread(target=cancel, daemon=True)
            writer.start()
            deadline = time.monotonic() + BOUND_S
            while not _waiting_on_a_lock(pg_url, pid):  # another server session's state
                assert time.monotonic() < deadline, "the write never waited on the lock"
                time.sleep(0.01)
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
