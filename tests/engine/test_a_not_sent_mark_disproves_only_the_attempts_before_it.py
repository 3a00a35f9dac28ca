"""An operator's `--mark not-sent` (like a query's `not_found`) disproves the attempts made
before it, never those made after it, whatever the clocks say: the mark is written on the
operator's clock (`reconcile --manual`, on a workstation, or after an NTP step) and the
attempts on the worker's. With the operator's clock minutes ahead, a mark read by clock alone
also "disproved" the attempt `resume` made after it, whose request the receiver committed: a
refused retry then gave the item up as never delivered, or a cancel left it so, and sending
the file again delivered it a second time. On both stores, at N = 1 (one row)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores
RETRY = "[retry]\nmax_attempts = 6\nbackoff_base = 0.02\nbackoff_max = 0.1\n"


def _unknown_then_marked_not_sent_ahead(
    ws: Workspace, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """u1 sent (1st POST 500, nothing committed; 2nd refused 401: unknown, maybe delivered),
    then marked not sent by an operator whose clock runs 5 minutes ahead; the worker's
    clock right again afterwards."""
    (ws.path / "notifier.toml").write_text(
        webhook_config(receiver, idempotent=True, status=False, timeout=1, retry=RETRY)
    )
    ws.write_csv("batch.csv", make_rows(1))
    first = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert first.exit_code == 3, first.output
    assert ws.ledger.item("u1").state == "unknown"
    assert receiver.deliveries() == {}  # truly nothing delivered so far
    monkeypatch.setattr(clock, "_SHIFT", timedelta(minutes=5))
    marked = ws.invoke(
        "reconcile", "--manual", "--item", "u1", "--mark", "not-sent",
        "--evidence", "not in the receiver's log",
    )  # fmt: skip
    assert marked.exit_code in (0, 3), marked.output
    monkeypatch.setattr(clock, "_SHIFT", timedelta(0))


@pytest.mark.timeout(60)
def test_a_not_sent_mark_from_a_clock_ahead_never_disproves_a_later_delivery(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the mark, `resume`'s request is committed (answer lost: 500) and its retry
    refused (401): u1 stays unknown, never failed, and sending the file again sends nothing."""

    def answer(item_id: str, nth: int) -> int | None:
        receiver.commit_first = nth == 3
        return {1: 500, 2: 401, 3: 500, 4: 401}.get(nth)

    receiver = Receiver(answer=answer)
    with receiving(receiver):
        _unknown_then_marked_not_sent_ahead(ws, receiver, monkeypatch)
        resumed = ws.invoke("resume")
        assert receiver.deliveries() == {"u1": 1}  # the 3rd request was delivered
        state = ws.ledger.item("u1").state
        again = ws.invoke("send", "batch.csv", "--channel", "hooks")
        deliveries = receiver.deliveries()
    assert state == "unknown", (
        f"u1, whose 3rd request the receiver committed, ended {state!r}:\n{resumed.output}"
    )
    assert deliveries == {"u1": 1}, f"delivered twice: {deliveries}\n{again.output}"


@pytest.mark.timeout(60)
def test_a_cancel_after_a_not_sent_mark_from_a_clock_ahead_never_calls_a_delivery_unsent(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same clock ahead, through cancel: after the mark, `resume`'s request is committed
    (answer lost: retried under the same key), the retry is throttled for long (paused);
    `cancel` must settle that maybe-delivered item (unknown here: nothing can be asked), yet
    leaves it pending, never delivered, and sending the file again delivers it twice."""

    def answer(item_id: str, nth: int) -> int | None:
        receiver.commit_first = nth == 3
        return {1: 500, 2: 401, 3: 500, 4: 429}.get(nth)

    receiver = Receiver(answer=answer, retry_after="600")
    with receiving(receiver):
        _unknown_then_marked_not_sent_ahead(ws, receiver, monkeypatch)
        resumed = ws.invoke("resume", "--max-wait", "1")
        assert resumed.exit_code == 3, resumed.output  # paused by the long Retry-After
        assert receiver.deliveries() == {"u1": 1}
        cancelled = ws.invoke("cancel", "--report", "--format", "json")
        state = ws.ledger.item("u1").state
        again = ws.invoke("send", "batch.csv", "--channel", "hooks")
        deliveries = receiver.deliveries()
    assert (state, deliveries) == ("unknown", {"u1": 1}), (
        f"u1 delivered, left {state!r} by cancel, then delivered {deliveries}:\n"
        f"{cancelled.output}\n{again.output}"
    )
