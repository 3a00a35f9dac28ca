"""Migration m011 (why a run stopped, as a cause) on a database written by the code before
it, on both engines: a committed fixture holding a run stopped in each way that code stops
one opens, gains `runs.stop_cause` filled in from each run's stop reason, and its runs go
on by that cause: the interrupted run resumes without sending any item twice, and settling
the unknown items by hand keeps the paused run's reason up to date."""

from __future__ import annotations

import pytest

from notifier.domain.records import StopCause
from notifier.store import Store
from notifier.store.migrations import MIGRATIONS

from ..conftest import Workspace

pytestmark = pytest.mark.both_stores
# Each run of the fixture (tests/fixtures/make_m011_stopped_runs.py), and its cause.
CAUSES = {
    "m011-interrupted": StopCause.INTERRUPTED,  # SIGTERM after item 4
    "m011-unknown": StopCause.UNKNOWN_LEFT,  # k2 and k4 answered 500 (unknown)
    "m011-halted": StopCause.HALTED,  # a 410: the endpoint is gone
    "m011-rate": StopCause.RATE_LIMITED,  # a Retry-After longer than --max-wait
    "m011-conflict": StopCause.CONFLICT,  # a 422
    "m011-down": StopCause.CHANNEL_DOWN,  # nothing listening on the channel's port
    "m011-rejected": StopCause.REJECTED,
    "m011-cancelled": StopCause.CANCELLED,
    "m011-approval": StopCause.APPROVAL_EXPIRED,  # its approval expired mid-run
}


def test_each_stopped_run_gets_the_cause_its_reason_gave(ws: Workspace) -> None:
    """Opened read-write, the file is migrated; each run's cause is the one its reason
    stated, the reason itself unchanged, and m011 is recorded."""
    ws.load_fixture("m011-stopped-runs")
    # Read in m010's schema, before the migration (the read model is the current one's).
    before = dict(ws.query("SELECT run_id, stop_reason FROM runs"))
    store = Store.open(ws.db)
    try:
        runs = {run.run_id: run for run in store.core.runs()}
    finally:
        store.close()
    assert {run_id: run.stop_cause for run_id, run in runs.items()} == CAUSES
    assert {run_id: run.stop_reason for run_id, run in runs.items()} == before
    names = ws.ledger.migrations()
    assert names == sorted(m.name for m in MIGRATIONS)
    assert "m011_stop_cause" in names


def test_the_interrupted_run_resumes_and_sends_each_item_once(ws: Workspace) -> None:
    """Items 1-4 were sent before the SIGTERM; resume sends 5-10, each once, and the
    completed run keeps no stop reason or cause."""
    ws.load_fixture("m011-stopped-runs")
    assert len(ws.outbox_documents()) == 4
    resumed = ws.invoke("resume", "m011-interrupted")
    assert resumed.exit_code == 0, resumed.output
    documents = ws.outbox_documents()
    assert sorted(d["item_id"] for d in documents) == sorted(f"i{i}" for i in range(1, 11))
    run = ws.ledger.run("m011-interrupted")
    assert (run.state, run.stop_reason, run.stop_cause) == ("completed", None, None)


def test_settling_the_unknown_items_by_hand_follows_the_back_filled_cause(
    ws: Workspace,
) -> None:
    """The run paused for its 2 unknown items (cause back-filled from its reason): each
    decision by hand brings its reason up to date, and the last completes it."""
    ws.load_fixture("m011-stopped-runs")

    def mark(item: str, decision: str) -> None:
        result = ws.invoke(
            "reconcile", "m011-unknown", "--manual", "--item", item, "--mark", decision,
            "--evidence", "mail log",
        )  # fmt: skip
        assert result.exit_code in (0, 3), result.output

    mark("k2", "sent")
    run = ws.ledger.run("m011-unknown")
    assert (run.state, run.stop_reason, run.stop_cause) == (
        "paused", "1 item(s) with unknown outcome", "unknown_left"
    )  # fmt: skip
    mark("k4", "abandon")
    run = ws.ledger.run("m011-unknown")
    assert (run.state, run.stop_reason, run.stop_cause) == ("completed", None, None)
