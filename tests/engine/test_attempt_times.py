"""An attempt's recorded start is when its request left, not when its item was claimed: at
N = 1 and N = 8 with items claimed ahead, on both stores, through the real CLI against a
receiver on 127.0.0.1 (tests/receiver.py) that holds every answer until the test lets go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from notifier.channels import Ready, always
from notifier.domain import clock
from notifier.domain.answers import Receipt
from notifier.domain.intent import Intent

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.background import meanwhile
from ..support.held import Answered, HeldRun

pytestmark = pytest.mark.both_stores


def _every_kind(n: int) -> Callable[[str, int], int | None]:
    """The first answer of each item after the first N (those held, then acked), by its
    number: a 500 (uncertain; the status query then finds the request, committed first:
    closed by a query's finding), a 429 (throttled, sent again), or a 200 (an ack)."""

    def answer(item_id: str, nth: int) -> int | None:
        index = int(item_id[1:])
        return (500, 429, None)[index % 3] if nth == 1 and index > n else None

    return answer


@pytest.mark.timeout(90)
@pytest.mark.parametrize("answers", ["acks", "every-kind"])
@pytest.mark.parametrize("n", [1, 8])
def test_an_attempt_claimed_ahead_records_when_its_request_left(
    ws: Workspace, n: int, answers: str
) -> None:
    """Items claimed while every sender was busy leave only after the receiver answers: each
    such attempt's started_at is after that moment (the claim came before it), whatever
    closed it (an ack, a 5xx, a 429, a status query's finding), so a Retry-After or a query
    window counted from it is counted from the real request."""
    hold = threading.Event()
    every_kind = answers == "every-kind"
    receiver = (
        Receiver(hold=hold, answer=_every_kind(n), commit_first=True)
        if every_kind
        else (Receiver(hold=hold))
    )
    rows = 4 * n + 2  # more than the N sending plus the 3N claimed ahead
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            # Not idempotent, so a 500 is settled by the status query.
            webhook_config(receiver, idempotent=not every_kind, status=True)
        )
        ws.write_csv("batch.csv", make_rows(rows))
        freed: list[float] = []

        def answer_once_every_sender_waits() -> None:
            # Every sender is waiting for an answer; the items after them are claimed.
            try:
                receiver.wait_for(lambda r: len(r.arrivals) == n)
                freed.append(time.time())
            finally:
                hold.set()

        with meanwhile(answer_once_every_sender_waits):
            sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
    assert sent.exit_code == 0, sent.output
    released = freed[0]
    first_ids = {a.item_id for a in receiver.arrivals[:n]}
    item_of = {i.seq: i.item_id for i in ws.ledger.items()}
    later = [
        (item_of[a.seq], a.started_at)
        for a in ws.ledger.attempts()
        if a.outcome != "not_started" and item_of[a.seq] not in first_ids
    ]
    assert len(later) >= rows - n
    early = [
        (item_id, started)
        for item_id, started in later
        if datetime.fromisoformat(started).timestamp() < released
    ]
    assert early == [], f"recorded as started before any sender was free: {early}"
    if every_kind:
        closed = {a.outcome for a in ws.ledger.attempts()}
        assert {"uncertain", "throttled", "sent"} <= closed, closed


@dataclass
class _SlowToConnect(Answered):
    """A channel whose connection takes 30 s on the wall clock (moved on, not waited) before
    it asks the sender's last check and lets the request leave."""

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        clock._SHIFT += timedelta(seconds=30)
        return super().send(intent, ready)


def test_an_attempt_starts_when_its_connection_was_ready_not_before_connecting(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query window counts from when the request left: an attempt whose connection took
    30 s records its start once the connection was ready (the sender's last check), not
    before connecting, so a 404 cannot count 30 s too early."""
    monkeypatch.setattr(clock, "_SHIFT", timedelta(0))
    before = clock.now()
    channel = _SlowToConnect()
    run = HeldRun(ws, channel, 1, 1, hold=False)
    run.thread.start()
    run.finish(channel)
    (attempt,) = ws.ledger.attempts()
    started = attempt.started_at
    assert clock.parse(started) >= before + timedelta(seconds=30), (before, started)
