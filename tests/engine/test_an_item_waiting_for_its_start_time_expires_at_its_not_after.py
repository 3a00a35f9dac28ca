"""An item whose start time (or window, or backoff) comes after its `not_after` is expired
when its deadline passes, not when the run next wakes to send: a run with nothing else to
do wakes at the deadline, within --max-wait, rather than sleeping on to a start time the
item can no longer keep, or pausing with the item still `pending` past its deadline. Both
stores, N = 1 and 8, in-process against a loopback receiver."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.content.schedule import from_options

from ..conftest import Workspace, make_rows
from ..receiver import Receiver
from ..support.background import Worker
from .test_send_windows import receiver

pytestmark = pytest.mark.both_stores
__all__ = ["receiver"]  # the fixture, imported to be used here


def rows_with_deadlines(*deadlines: datetime | None) -> list[list[str]]:
    rows = make_rows(len(deadlines))
    rows[0].append("not_after")
    for row, deadline in zip(rows[1:], deadlines, strict=True):
        row.append("" if deadline is None else deadline.isoformat())
    return rows


@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.timeout(60)
def test_a_run_that_would_pause_for_a_start_time_expires_an_item_whose_deadline_comes_first(
    ws: Workspace, receiver: Receiver, concurrency: int
) -> None:
    """--not-before an hour ahead, --max-wait 60: u1's deadline (3 s ahead) passes within the
    wait, so the run waits for it and expires u1, and only then pauses for u2, which has no
    deadline. Without the deadline as a wake, the run paused at once with u1 `pending` past
    its deadline, told to resume an hour later."""
    now = datetime.now(UTC).replace(microsecond=0)
    deadline = now + timedelta(seconds=3)
    start = now + timedelta(hours=1)
    batch = ws.write_csv("b.csv", rows_with_deadlines(deadline, None))
    result = ws.invoke(
        "send", str(batch), "--channel", "hooks", "--not-before", start.isoformat(),
        "--concurrency", str(concurrency), "--max-wait", "60",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    states = {i.item_id: i.state for i in ws.ledger.items()}
    assert states == {"u1": "expired", "u2": "pending"}, result.output
    assert datetime.now(UTC) >= deadline
    assert receiver.arrivals == []
    run = ws.ledger.run()
    assert run.state == "paused"
    assert "1 item(s) wait for their start time or send window" in str(run.stop_reason)


@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.timeout(60)
def test_a_run_waiting_for_a_start_time_ends_when_its_only_item_passes_its_deadline(
    ws: Workspace, receiver: Receiver, concurrency: int
) -> None:
    """--not-before an hour ahead, --max-wait two hours, the one item's deadline 3 s ahead:
    the run ends once the deadline has passed (the item expired, never sent), not an hour
    later when the start time comes."""
    now = datetime.now(UTC).replace(microsecond=0)
    deadline = now + timedelta(seconds=3)
    batch = ws.write_csv("b.csv", rows_with_deadlines(deadline))
    schedule = from_options((now + timedelta(hours=1)).isoformat(), None, None, {})
    notifier = Notifier.open(ws.db)
    began = time.monotonic()
    sending = Worker(
        lambda: notifier.send(
            Path(batch),
            channel="hooks",
            concurrency=concurrency,
            max_wait=7200.0,
            schedule=schedule,
        )
    )
    # The deadline is 3 s away; the start time an hour: 30 s is ample for the first only.
    assert sending.exit_code(timeout=30) == 3
    assert time.monotonic() - began < 30
    assert [(i.item_id, i.state, i.attempts) for i in ws.ledger.items()] == [("u1", "expired", 0)]
    assert receiver.arrivals == []
