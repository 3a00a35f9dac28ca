"""The status query after an uncertain send runs on the sender's thread: while
one item's query waits on the receiver, the committer goes on recording the other items'
answers, and once the query answers the item is settled by what it found. Against a
receiver on 127.0.0.1 (tests/receiver.py), at N = 1 and 8, on both stores, the engine in a
thread of the test (notifier.api). Killed while the query waits:
tests/crash/test_a_kill_during_a_status_query.py."""

from __future__ import annotations

import threading

import pytest

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import WAIT_S, Receiver, receiving, released, webhook_config
from ..support.background import exit_code, send_in_background

pytestmark = pytest.mark.both_stores

ROWS = 40


def _sent_others(ws: Workspace) -> int:
    """Items other than u1 recorded as sent."""
    return len([i for i in ws.ledger.items() if i.item_id != "u1" and i.state == "sent"])


def _u1(ws: Workspace) -> tuple[str, str | None]:
    u1 = ws.ledger.item("u1")
    return u1.state, ws.ledger.receipt_sources().get(u1.idempotency_key)


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.timeout(120)
def test_a_held_status_query_does_not_hold_up_the_other_items(ws: Workspace, n: int) -> None:
    """u1's send is committed by the receiver but answered 500 (a channel that cannot
    dedupe, with a status query): its status query is held at the receiver. At N = 8 every
    other item is recorded sent meanwhile (the committer only records; the query waits on
    u1's sender); at N = 1 (the sequential protocol: the send and its query are the
    committer's own) u1 is still in flight. Released, the query finds the delivery: u1 is
    sent by the query's receipt, its request made once, and the run completes."""
    receiver = Receiver(
        answer=lambda item, nth: 500 if item == "u1" and nth == 1 else None,
        commit_first=True,
        query_hold=threading.Event(),
    )
    assert receiver.query_hold is not None
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            # A timeout longer than any wait here: the held query never times out meanwhile.
            webhook_config(receiver, idempotent=False, status=True, timeout=WAIT_S + 10)
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        # The engine in a thread: the query on u1's sender and the committer are its own.
        sending = send_in_background(ws, "hooks", n)
        with released([], receiver.query_hold):
            receiver.wait_for(lambda r: len(r.queries) >= 1)  # u1's query is held
            if n > 1:
                wait_for(
                    lambda: _sent_others(ws) == ROWS - 1,
                    "every other item recorded sent while u1's query is held",
                    timeout=WAIT_S - 10,
                )
            else:
                # One sender, and it is the committer: nothing else moves meanwhile.
                assert _sent_others(ws) == 0
            assert not receiver.query_hold.is_set()
            assert _u1(ws) == ("in_flight", None), "u1 is recorded only with its finding"
            receiver.query_hold.set()
            result = sending.result()
    assert exit_code(result) == 0, result
    assert _u1(ws) == ("sent", "query")
    assert receiver.posts("u1") == 1, "found by the query: never sent again"
    assert _sent_others(ws) == ROWS - 1
    assert len(receiver.queries) == 1
