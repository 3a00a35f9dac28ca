"""The revisit's status query runs on a sender's thread: an item whose early 404
came inside its query window (`timeout + query_delay` after its request left) is asked again
once the window has passed, and while
the receiver holds that second query the committer goes on claiming, sending and recording
the other items; the held query's answer, when it comes, settles the item. Against a
receiver on 127.0.0.1 (tests/receiver.py), at N = 1 and 8, on both stores, the engine in a
thread of the test (notifier.api). Killed while the query is held:
tests/crash/test_a_kill_during_a_revisit_query.py."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import HoldAfter, Receiver, receiving, released, webhook_config
from ..support.background import exit_code, send_in_background

pytestmark = pytest.mark.both_stores

# u1's first answer is a 500 that committed nothing: the sender's query right after it
# finds nothing, which proves nothing inside the query window, so u1 waits, unknown, to be
# asked again then (the revisit).
QUERY_DELAY_S = 0.3
# Each other request takes this long at the receiver, so at N = 8 the run is still sending
# most of its items when the revisit's query comes (about a second in): 200 items, 8 at once.
COMMIT_DELAY_S = 0.05
# With a held query: the channel's timeout, longer than the hold (the held query must not
# time out), and the time each other request takes, so that the run is still sending when
# u1's window (this timeout + query_delay after its request left) has passed: at N = 8,
# 300 items take about 15 s; at N = 1, 30 take about 12 s.
HELD_TIMEOUT_S = 8
HELD_COMMIT_DELAY_S = 0.4


def _rows(n: int, held: bool = False) -> int:
    if held:
        return 300 if n > 1 else 30
    return 200 if n > 1 else 20


def _receiver(commit_delay_s: float = COMMIT_DELAY_S) -> tuple[Receiver, HoldAfter]:
    """u1: 500 at first (nothing committed); its first status query answers (404), every
    later one is held until the test releases the hold."""
    hold = HoldAfter(1)
    receiver = Receiver(
        answer=lambda item, nth: 500 if item == "u1" and nth == 1 else None,
        commit_delay_s=commit_delay_s,
        query_hold=hold,
    )
    return receiver, hold


def _sent_others(ws: Workspace) -> int:
    """Items other than u1 recorded as sent."""
    return len([i for i in ws.ledger.items() if i.item_id != "u1" and i.state == "sent"])


def _u1(ws: Workspace) -> str:
    return ws.ledger.item("u1").state


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.timeout(120)
def test_a_held_revisit_query_does_not_hold_up_the_other_items(ws: Workspace, n: int) -> None:
    """u1 waits, unknown, for its query window; the revisit's query is held at the
    receiver. At N = 8 the other items, many not yet sent when it was held, are claimed,
    sent and recorded meanwhile (the committer only picks and records; a sender waits for
    the answer); at N = 1 (the sequential protocol: the query is the committer's own)
    nothing else moves. Released, the query finds nothing, now proof: u1 is sent again
    under its key, once, and the run completes with every key committed once."""
    receiver, hold = _receiver(HELD_COMMIT_DELAY_S)
    rows = _rows(n, held=True)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(
                receiver,
                idempotent=False,
                status=True,
                timeout=HELD_TIMEOUT_S,
                query_delay=QUERY_DELAY_S,
            )
        )
        ws.write_csv("batch.csv", make_rows(rows))
        # The engine in a thread: the revisit's query on a sender and the committer are its own.
        sending = send_in_background(ws, "hooks", n)
        with released([], hold):
            receiver.wait_for(lambda r: len(r.queries) >= 2)  # the revisit's query is held
            assert _u1(ws) == "unknown"
            if n > 1:
                with receiver.lock:
                    posted = len(receiver.arrivals)
                assert posted < rows - 20, f"the run was nearly over ({posted} requests made)"
                # Sixteen more (two rounds of the 8 senders), a bound the hold keeps well
                # inside the query's timeout however slow the machine.
                before = _sent_others(ws)
                wait_for(
                    lambda: _sent_others(ws) >= before + 16,
                    "other items recorded sent while u1's revisit query is held",
                    timeout=HELD_TIMEOUT_S - 2,
                )
            else:
                # One sender, and it is the committer: the run waits for the query, with at
                # most the one send answered just before it not yet recorded (besides u1).
                with receiver.lock:
                    posted = len(receiver.arrivals)
                settled = _sent_others(ws)
                assert posted - 2 <= settled <= posted - 1
                assert settled < rows - 1
            assert _u1(ws) == "unknown", "u1 is recorded only with its finding"
            assert len(receiver.queries) == 2, "asked once more, not once per turn"
            hold.set()
            result = sending.result()
    assert exit_code(result) == 0, result
    assert _u1(ws) == "sent"
    assert receiver.posts("u1") == 2, "sent again once the held query proved it undelivered"
    assert _sent_others(ws) == rows - 1
    assert set(receiver.commits.values()) == {1}, "every key committed once"
