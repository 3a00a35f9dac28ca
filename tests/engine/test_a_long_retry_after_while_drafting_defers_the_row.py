"""A 429 whose Retry-After is longer than drafting waits (a day, or a number too large for
the clock: `1e12`, `inf`) is a server asking to come back later: the row is left undrafted
for `resume` (exit 3, what was drafted kept), as a long Retry-After pauses a send. Drafting
neither sleeps for a day nor ends in an internal error (exit 1: the wait overflowed)."""

from __future__ import annotations

from collections import deque

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, error
from .test_compose import batch, brief

# "thread": a wait that never ends (as before the fix) stops this test, not the session.
pytestmark = pytest.mark.timeout(60, method="thread")


@pytest.mark.parametrize("retry_after", ["86400", "1e12", "inf"])
def test_a_row_asked_to_wait_longer_than_drafting_waits_is_left_for_resume(
    ws: Workspace, fake: FakeMessages, retry_after: str
) -> None:
    fake.per_row["u1"] = deque(
        [error(429, "rate_limit_error", "come back later", {"retry-after": retry_after})]
    )
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "internal error" not in result.output
    assert [(d["seq"], d["state"]) for d in ws.ledger.drafts()] == [(1, "pending"), (2, "drafted")]
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == ["u1", "u2"]
