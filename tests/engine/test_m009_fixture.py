"""Migration m009 (send windows) on a database written by the code before it, on both
engines: a committed fixture with a run left in flight by a killed process opens, gains the
`not_before`, `send_window` and `send_tz` columns, and resumes without sending any item
twice; its items, planned without a start time, wait for none."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from notifier.store.migrations import MIGRATIONS

from ..conftest import Workspace

pytestmark = pytest.mark.both_stores
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_an_m007_database_with_a_run_in_flight_resumes_after_m009(ws: Workspace) -> None:
    """The run killed after item 6 left (items 1-5 sent, 6 in flight, 7-20 pending) resumes
    under m009: item 6 is found in the outbox and not written again, every other item once,
    none waits for a start time, and m009 is recorded."""
    if ws.url:
        with psycopg.connect(ws.url, autocommit=True) as conn:
            conn.execute((FIXTURES / "m009-inflight-run-pg.sql").read_text().encode())
        shutil.copytree(FIXTURES / "m009-inflight-run-pg.outbox", ws.outbox)
    else:
        shutil.copy(FIXTURES / "m009-inflight-run.db", ws.db_file)
        shutil.copytree(FIXTURES / "m009-inflight-run.outbox", ws.outbox)
    assert len(ws.outbox_documents()) == 6
    resumed = ws.invoke("resume", "m009-fixture")
    assert resumed.exit_code == 0, resumed.output
    assert "receipt found" in resumed.stdout, resumed.stdout
    documents = ws.outbox_documents()
    assert sorted(d["item_id"] for d in documents) == sorted(f"m5-{i}" for i in range(1, 21))
    assert ws.status()["counts"]["sent"] == 20
    unscheduled = {"not_before": None, "send_window": None, "send_tz": None}
    assert [s for s in ws.ledger.schedules() if s.items() >= unscheduled.items()] == (
        ws.ledger.schedules()
    )
    assert len(ws.ledger.schedules()) == 20
    names = ws.ledger.migrations()
    assert "m009_send_windows" in names  # not the last: m010 came after it
    assert names == sorted(m.name for m in MIGRATIONS)
    assert "m007_draft_chunks" in names
