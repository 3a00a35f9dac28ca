"""A run that pauses names what it waits for: a start time or send window only when that is
what comes first. Waiting out a Retry-After longer than --max-wait while another row's
start time comes later still, it pauses until the Retry-After ends and says the downstream
asked to wait, never that its rows wait for their start time until a moment none of them
starts at. Both stores, N = 1 and 8, through the real CLI against a loopback receiver."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores


@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.timeout(60)
def test_a_pause_for_a_retry_after_names_the_downstream_not_a_later_start_time(
    ws: Workspace, concurrency: int
) -> None:
    """u1 is answered 429 with Retry-After an hour; u2 may start only in two hours: the run
    pauses (exit 3) until the hour is over, for the downstream; status still says u2 waits
    for its start time, two hours ahead."""
    receiver = Receiver(answer=lambda item_id, n: 429 if item_id == "u1" else None)
    receiver.retry_after = "3600"
    start = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    rows = make_rows(2)
    rows[0].append("not_before")
    rows[1].append("")
    rows[2].append(start.isoformat())
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        result = ws.invoke(
            "send", str(ws.write_csv("b.csv", rows)), "--channel", "hooks",
            "--max-wait", "5", "--concurrency", str(concurrency),
        )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "wait for their start time" not in result.output, result.output
    status = ws.status()
    until = clock.parse(str(status["paused_until"]))
    assert until < start - timedelta(minutes=30)  # the Retry-After's end, not u2's start
    assert str(status["stop_reason"]).startswith("the downstream asked to wait until")
    assert status["waiting"] == {"count": 1, "next_opens_at": clock.iso(start)}
    assert [a.item_id for a in receiver.arrivals] == ["u1"]
