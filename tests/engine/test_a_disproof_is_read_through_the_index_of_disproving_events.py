"""Whether an attempt was disproved (statements.DISPROVED) is read, on SQLite, through
m004's events_disproof, which holds only the disproving events: without statistics SQLite
would pick m014's events_by_item, which holds every event of the item, and read each of
them (four times as long for the kinds of 100,000 retried items). Every statement that asks
it, as the store compiles it for a fresh database (EXPLAIN QUERY PLAN)."""

from __future__ import annotations

import pytest

from notifier.store import Store
from notifier.store.sqlite import SqliteEngine
from notifier.store.statements import ledger, queries, suppressions

from ..conftest import Workspace

ASKING = {
    "the kinds of the pending retried items": queries.PENDING_KINDS,
    "the maybe delivered among some items": queries.maybe_delivered_among(2),
    "a run's attempts": queries.attempts(of_one=False),
    "one item's attempts": queries.attempts(of_one=True),
    "the items due to expire": ledger.DUE_FOR_EXPIRY,
    "the items due to expire, locked": ledger.DUE_FOR_EXPIRY_LOCKED,
    "the suppressed items that may have been delivered": suppressions.attempted_maybe_delivered(2),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", sorted(ASKING))
def test_a_disproof_is_read_through_events_disproof(ws: Workspace, what: str) -> None:
    store = Store.open(ws.db, create=True)
    try:
        engine = store.core.engine
        assert isinstance(engine, SqliteEngine)
        plan = [
            row[-1]
            for row in engine.execute(
                "EXPLAIN QUERY PLAN " + ASKING[what],
                {"run_id": "r", "seq": 1, "at": "", "s0": 1, "s1": 2},
            )
        ]
    finally:
        store.close()
    on_events = [
        detail for detail in plan if detail.split()[:2] in (["SEARCH", "e"], ["SCAN", "e"])
    ]
    assert on_events == ["SEARCH e USING INDEX events_disproof (run_id=? AND item_seq=?)"], plan


def test_every_statement_that_asks_is_listed() -> None:
    """A statement added later that asks whether an attempt was disproved is planned above
    too: every constant of the statement modules that holds the hint is in ASKING."""
    asking = {
        f"{module.__name__}.{name}"
        for module in (ledger, queries, suppressions)
        for name, value in vars(module).items()
        if isinstance(value, str) and "{indexed_events_disproof}" in value
        if value.startswith(("SELECT", "UPDATE", "DELETE"))  # a statement, not a condition
    }
    listed = {
        f"{module.__name__}.{name}"
        for module in (ledger, queries, suppressions)
        for name, value in vars(module).items()
        if isinstance(value, str) and value in ASKING.values()
    }
    assert asking and asking <= listed, asking - listed
