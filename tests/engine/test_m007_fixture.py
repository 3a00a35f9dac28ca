"""Migration m007 (draft chunks) on a database written by the code before it, on both
engines: a committed fixture with a run left in flight by a killed process opens, gains the
`draft_chunks` table, and resumes without sending any item twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from notifier.store.migrations import MIGRATIONS

from ..conftest import Workspace

pytestmark = pytest.mark.both_stores
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_an_m006_database_with_a_run_in_flight_resumes_after_m007(ws: Workspace) -> None:
    """The run killed after item 6 left (items 1-5 sent, 6 in flight, 7-20 pending) resumes
    under m007: item 6 is found in the outbox and not written again, every other item once,
    and the new table exists, empty, with m007 recorded."""
    if ws.url:
        with psycopg.connect(ws.url, autocommit=True) as conn:
            conn.execute((FIXTURES / "m007-inflight-run-pg.sql").read_text().encode())
        shutil.copytree(FIXTURES / "m007-inflight-run-pg.outbox", ws.outbox)
    else:
        shutil.copy(FIXTURES / "m007-inflight-run.db", ws.db_file)
        shutil.copytree(FIXTURES / "m007-inflight-run.outbox", ws.outbox)
    assert len(ws.outbox_documents()) == 6
    resumed = ws.invoke("resume", "m007-fixture")
    assert resumed.exit_code == 0, resumed.output
    assert "receipt found" in resumed.output, resumed.output
    documents = ws.outbox_documents()
    assert len(documents) == 20
    assert sorted(d["item_id"] for d in documents) == sorted(f"m5-{i}" for i in range(1, 21))
    assert ws.status()["counts"]["sent"] == 20
    assert ws.ledger.draft_chunks() == []
    names = ws.ledger.migrations()
    assert names == sorted(m.name for m in MIGRATIONS)
