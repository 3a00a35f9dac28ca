"""An item whose not_after passed before it was claimed is handed to no sender
(deadlines.split_stale): no request left for it, so it must not count as attempted. The
report says how many attempts each item had and calls a pending item with one "attempted",
so a counted claim would read as a request that went out (and, in a run cancelled before
the next expiry pass, as "pending (attempted, left unsent)"). At N = 1 and N = 8 with 3N
claimed ahead, both stores: the deadline passes while the first requests are under way (this
process's clock moves two hours on), and the items claimed after it end expired with no
attempt counted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifier.domain import clock
from notifier.engine.run_control import Stop

from ..conftest import Workspace
from ..support.held import Answered, HeldRun

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


@pytest.mark.parametrize("n", [1, 8])
def test_items_claimed_after_their_deadline_end_expired_with_no_attempt(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    channel = Answered()
    # More items than the first requests and those claimed with them: the rest are claimed
    # only after the deadline passed.
    run = HeldRun(ws, channel, n, 6 * n, hold=False, not_after=clock.iso(clock.later(3600)))
    run.thread.start()
    try:
        channel.wait_started(n)
        monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))
        channel.let_all_go()
    finally:
        result = run.finish(channel)
    assert result.stop is Stop.COMPLETED, result
    assert len(channel.started) == n
    items = ws.ledger.items()
    assert {i.state for i in items} == {"sent", "expired"}
    expired = [i for i in items if i.state == "expired"]
    assert len(expired) == 5 * n
    assert [(i.item_id, i.attempts) for i in expired if i.attempts] == []
    # The report shows the same: attempts only where a request left.
    shown = {row["id"]: row["attempts"] for row in ws.status()["items"]}
    assert {item: a for item, a in shown.items() if a} == {
        i.item_id: 1 for i in items if i.state == "sent"
    }
