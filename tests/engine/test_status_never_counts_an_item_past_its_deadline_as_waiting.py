"""An item whose `not_after` has passed waits for nothing: it is expired, never sent, when
the run next goes on. `status` and `report` count as waiting for a start time or send
window only the items that may still go then, so a paused run never promises the opening
to rows that will not be sent. Both stores, through the real CLI; this process's clock
moved past the deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace
from ..receiver import Receiver
from .test_an_item_waiting_for_its_start_time_expires_at_its_not_after import rows_with_deadlines
from .test_send_windows import receiver

pytestmark = pytest.mark.both_stores
__all__ = ["receiver"]  # the fixture, imported to be used here


@pytest.mark.timeout(60)
def test_a_paused_runs_item_past_its_deadline_is_not_counted_as_waiting(
    ws: Workspace, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--not-before an hour ahead, --max-wait 1: the run pauses at once with u1 (deadline a
    minute ahead) and u2 (none) pending. Two minutes on, status says one item waits for
    the start time, u2, never u1, which is past its deadline."""
    now = datetime.now(UTC).replace(microsecond=0)
    start = now + timedelta(hours=1)
    batch = ws.write_csv("b.csv", rows_with_deadlines(now + timedelta(minutes=1), None))
    result = ws.invoke(
        "send", str(batch), "--channel", "hooks", "--not-before", start.isoformat(),
        "--max-wait", "1",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert ws.status()["waiting"]["count"] == 2
    monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(minutes=2))
    status = ws.status()
    assert status["counts"]["pending"] == 2
    assert status["waiting"] == {"count": 1, "next_opens_at": clock.iso(start)}
    table = ws.invoke("status")
    assert "1 pending item(s) wait for their start time or send window" in table.stdout
    assert receiver.arrivals == []
