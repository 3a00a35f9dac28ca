"""`status` and `report` count an item as waiting for its send window whenever its window is
closed, not only once a claim has moved its start time on: a run stopped while its window
was open (a pause, a kill) and looked at after the window closed has every pending item
waiting for the window's next opening, and says when that is. Both stores, through the
real CLI against a loopback receiver; this process's clock moved past the window's end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver
from .test_send_windows import ZONE, receiver, window_from

pytestmark = pytest.mark.both_stores
__all__ = ["receiver"]  # the fixture, imported to be used here


@pytest.mark.timeout(60)
def test_items_of_a_stopped_run_whose_window_closed_are_reported_waiting(
    ws: Workspace, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window open for the hour from now, --rate 0.001: u1 goes, the run pauses for the
    rate with u2 and u3 pending. Two hours on, the window is closed until next week: status
    says both wait for it and when it opens, as it says of items a claim has moved on."""
    opens = datetime.now(UTC).replace(microsecond=0)
    window = window_from(opens, 3600, ZONE)
    result = ws.invoke(
        "send", str(ws.write_csv("b.csv", make_rows(3))), "--channel", "hooks",
        "--window", window, "--tz", ZONE, "--rate", "0.001", "--max-wait", "5",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert len(receiver.arrivals) == 1
    monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(hours=2))
    status = ws.status()
    assert status["counts"]["pending"] == 2
    assert status["waiting"]["count"] == 2, status["waiting"]
    assert status["waiting"]["next_opens_at"] == clock.iso(opens + timedelta(days=7))
    table = ws.invoke("status")
    assert "2 pending item(s) wait for their start time or send window" in table.stdout
