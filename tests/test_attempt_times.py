"""An attempt's recorded start is when its request left, not when its item was claimed: at
N = 1 and N = 8 with items claimed ahead, on both stores, through the real CLI against a
receiver on 127.0.0.1 (tests/receiver.py) that holds every answer until the test lets go."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest

from .conftest import Workspace, make_rows
from .receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 8])
def test_an_attempt_claimed_ahead_records_when_its_request_left(ws: Workspace, n: int) -> None:
    """Items claimed while every sender was busy leave only after the receiver answers: each
    such attempt's started_at is after that moment (the claim came before it), so a
    Retry-After or a query window counted from it is counted from the real request."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    rows = 4 * n + 2  # more than the N sending plus the 3N claimed ahead
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(rows))
        process = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        try:
            # Every sender is waiting for an answer; the items after them are claimed.
            receiver.wait_for(lambda r: len(r.arrivals) == n)
            released = time.time()
            hold.set()
            out, err = process.communicate(timeout=60)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, out + err
    first_ids = {a.item_id for a in receiver.arrivals[:n]}
    later = ws.query(
        "SELECT i.item_id, a.started_at FROM attempts a JOIN items i "
        "ON i.run_id = a.run_id AND i.seq = a.seq WHERE a.outcome <> 'not_started'"
    )
    later = [(item_id, started) for item_id, started in later if item_id not in first_ids]
    assert len(later) >= rows - n
    early = [
        (item_id, started)
        for item_id, started in later
        if datetime.fromisoformat(started).timestamp() < released
    ]
    assert early == [], f"recorded as started before any sender was free: {early}"
