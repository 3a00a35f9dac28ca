"""A read-only command (`status`, `report`, `metrics`, `cancel --report`) reads its run in one
snapshot. When the server ends that session under it (pg_terminate_backend, a failover, a
restart), it is the database that failed: a storage failure naming the server and what to
do, as for a write, never an "internal error" (exit 1) with the driver's text."""

from __future__ import annotations

import psycopg
import pytest

from notifier.domain.errors import ExitCode, NotifierError
from notifier.store import Store

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("ws", ["postgres"], indirect=True)]


def test_a_snapshot_whose_session_the_server_ends_fails_as_storage(ws: Workspace) -> None:
    ws.write_csv("batch.csv", make_rows(2))
    planned = ws.invoke("send", "batch.csv", "--require-approval")
    assert planned.exit_code == 0, planned.output
    store = Store.open(ws.db, readonly=True)
    try:
        with pytest.raises(NotifierError) as failed, store.reading():
            (backend,) = store.engine.execute("SELECT pg_backend_pid()").fetchone()
            with psycopg.connect(ws.url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
            store.queries.counts(store.core.runs()[0].run_id)
    finally:
        store.close()
    assert failed.value.exit_code is ExitCode.ATTENTION, failed.value
    assert "could not be reached" in str(failed.value) or "server" in str(failed.value)
