"""At --concurrency 1 the sender's last check reads the suppression list on the
committer's connection (Dispatch.listed, engine/sending.py). That read can fail (SQLite
"database is locked" past busy_timeout, a PostgreSQL connection blip) BEFORE anything of
the message has left. send_one treats any exception in its block as a channel bug after
which "the request may have left" (ErrorKind.UNCERTAIN): on a channel that can neither
dedupe nor be asked (SMTP, Apprise) the item would become unknown, a report that says it
may have been delivered though nothing left, and a halt after unknown_streak_limit of them.
A failed read holds the item back instead: released, never attempted."""

from __future__ import annotations

import sqlite3

import pytest

from notifier.domain.records import Item

from ..conftest import Workspace
from ..support.held import Answered, HeldRun


@pytest.mark.timeout(60)
def test_a_suppression_read_that_fails_before_the_send_leaves_the_item_unsent(
    ws: Workspace,
) -> None:
    channel = Answered(idempotent=False, queryable=False)
    channel.let_all_go()
    run = HeldRun(ws, channel, 1, 1, hold=False, to="ann@example.com")
    failures = [sqlite3.OperationalError("database is locked")]
    real = run.runner.dispatch.listed

    def listed(item: Item) -> bool:
        if failures:
            raise failures.pop()
        return real(item)

    run.runner.dispatch.listed = listed
    run.thread.start()
    result = run.finish(channel)
    counts = ws.ledger.state_counts()
    assert "unknown" not in counts, (
        f"{counts}: an item whose request never left is reported as maybe delivered "
        f"({result.stop.value}: {result.reason})"
    )
    # Held back, never attempted, then claimed again once the list could be read: sent once.
    assert counts == {"sent": 1}, counts
    assert [item for item, _ in channel.started] == ["1"]
