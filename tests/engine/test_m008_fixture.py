"""Migration m008 (the suppression list) on a database written by the code before it, on
both engines: a committed fixture with a run left in flight by a killed process opens,
gains the `suppressions` and `suppression_audit` tables, and resumes without sending any
item twice; the list then works on the migrated database."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.both_stores
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_an_m007_database_with_a_run_in_flight_resumes_after_m008(ws: Workspace) -> None:
    """The run killed after item 6 left (items 1-5 sent, 6 in flight, 7-20 pending) resumes
    under m008: item 6 is found in the outbox and not written again, every other item once,
    m008 is recorded and its tables exist, empty; then `suppress add` works on the file."""
    if ws.url:
        with psycopg.connect(ws.url, autocommit=True) as conn:
            conn.execute((FIXTURES / "m008-inflight-run-pg.sql").read_text().encode())
        shutil.copytree(FIXTURES / "m008-inflight-run-pg.outbox", ws.outbox)
    else:
        shutil.copy(FIXTURES / "m008-inflight-run.db", ws.db_file)
        shutil.copytree(FIXTURES / "m008-inflight-run.outbox", ws.outbox)
    assert len(ws.outbox_documents()) == 6
    resumed = ws.invoke("resume", "m008-fixture")
    assert resumed.exit_code == 0, resumed.output
    assert "receipt found" in resumed.output, resumed.output
    documents = ws.outbox_documents()
    assert len(documents) == 20
    assert sorted(d["item_id"] for d in documents) == sorted(f"m8-{i}" for i in range(1, 21))
    assert ws.status()["counts"]["sent"] == 20
    assert ws.status()["counts"]["suppressed"] == 0
    assert ws.ledger.suppressions() == [] and ws.ledger.suppression_audit() == []
    names = ws.ledger.migrations()
    assert names[7] == "m008_suppression"  # later migrations (m009 on) may follow
    added = ws.invoke("suppress", "add", "User1@Example.com", "--reason", "asked to stop")
    assert added.exit_code == 0, added.output
    assert ws.ledger.suppressions() == [("user1@example.com", "asked to stop", "operator")]
