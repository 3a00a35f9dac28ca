"""A database written before m003 (schema m001, a run paused by Ctrl-C) opens and resumes."""

from __future__ import annotations

import shutil

from ..conftest import ROOT, Workspace

FIXTURE = ROOT / "tests" / "fixtures" / "m001-paused-run.db"


def test_a_paused_m001_run_is_migrated_and_resumed_exactly_once(ws: Workspace) -> None:
    """The m001 file gains m003 on open; resume sends only its 187 pending items, each once,
    and the items it sent before the upgrade stay sent."""
    shutil.copy(FIXTURE, ws.db_file)
    assert ws.query("SELECT state FROM runs") == [("paused",)]
    before = dict(ws.query("SELECT state, COUNT(*) FROM items GROUP BY state"))
    assert before == {"sent": 13, "pending": 187}
    pending = {r[0] for r in ws.query("SELECT item_id FROM items WHERE state = 'pending'")}

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert "resuming run fixture-paused" in resumed.output
    migrations = set(ws.ledger.migrations())
    assert {"m001_initial", "m003_deadlines_and_drafts"} <= migrations
    documents = ws.outbox_documents()
    assert sorted(d["item_id"] for d in documents) == sorted(pending)
    stored = {i.idempotency_key: i.intent_digest for i in ws.ledger.items()}
    assert all(stored[d["idempotency_key"]] == d["intent_digest"] for d in documents)
    counts = ws.status()["counts"]
    assert counts["sent"] == 200 and counts["expired"] == 0 and counts["pending"] == 0
