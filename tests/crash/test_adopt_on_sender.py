"""A dead worker's items, adopted mid-run, are asked about on a sender's thread:
while the receiver holds worker A's status queries about what worker B left in flight
when it was killed (-9), A's committer goes on recording its own items; released, the
queries settle B's items and A completes the run with every key committed once. Real
`notifier` processes on a real PostgreSQL server, against a receiver on 127.0.0.1."""

from __future__ import annotations

import signal
import threading

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import WAIT_S, Receiver, receiving, released, webhook_config
from .test_workers import finish, fleet, holders, notifier, pg_url, rows

__all__ = ["pg_url"]  # the fixture, from test_workers

ROWS = 600
COMMIT_DELAY_S = 0.05  # each request's time at the receiver: A sends for seconds after B dies


def _sent_except(db: str, seqs: set[int]) -> int:
    """Items recorded sent, other than `seqs`."""
    sent = rows(db, "SELECT seq FROM items WHERE state = 'sent'")
    return sum(1 for (seq,) in sent if seq not in seqs)


def test_held_adoption_queries_do_not_hold_up_the_adopting_worker(
    ws: Workspace, pg_url: str
) -> None:
    """B (N = 2, items claimed ahead) is killed -9 holding items in flight; A (N = 16)
    adopts them and its status queries about them are held. Meanwhile A, still far from
    done, records every other item sent (the committer only reaps and records; its
    senders ask), and B's items stay in flight, not sent by A. Released: B's items are
    settled by the queries (found, or sent again once proven undelivered), A exits 0 with
    the run completed, and every key is committed exactly once."""
    # Every answer is held until both workers hold items (then B is killed); every status
    # query (there are no others here: the channel dedupes, an uncertain answer is sent
    # again) is held until the test has seen A record its own items meanwhile.
    hold, query_hold = threading.Event(), threading.Event()
    receiver = Receiver(commit_delay_s=COMMIT_DELAY_S, hold=hold, query_hold=query_hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            # A timeout longer than any hold here: a held query never times out meanwhile.
            webhook_config(
                receiver, idempotent=True, status=True, timeout=WAIT_S + 10, query_delay=0.2
            )
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        first = fleet(ws, pg_url, "a1", 1, 16)[0]
        wait_for(lambda: len(holders(pg_url, "a1")) == 1, "A holds items")
        second = notifier(ws, pg_url, "worker", "a1", "--concurrency", "2")
        with released([first, second], hold, query_hold):
            wait_for(lambda: len(holders(pg_url, "a1")) == 2, "both workers hold items")
            ((b_id,),) = rows(pg_url, "SELECT worker_id FROM workers WHERE pid = ?", (second.pid,))
            # B's items are read while B is stopped: it claims nothing more, and A cannot
            # adopt them yet (B's process still exists). Read after the kill, A could already
            # have adopted them (it did, under load), leaving none under B's name.
            second.send_signal(signal.SIGSTOP)
            b_items = {
                seq
                for (seq,) in rows(
                    pg_url,
                    "SELECT seq FROM items WHERE worker_id = ? AND state = 'in_flight'",
                    (b_id,),
                )
            }
            second.send_signal(signal.SIGKILL)
            second.wait()
            assert b_items, "B was killed holding items in flight"
            hold.set()
            receiver.wait_for(lambda r: len(r.queries) >= 1)  # A asks about B's items: held
            assert _sent_except(pg_url, b_items) < ROWS - len(b_items) - 100, "A was nearly done"
            wait_for(
                lambda: _sent_except(pg_url, b_items) == ROWS - len(b_items),
                "A records its own items while its queries about B's are held",
                timeout=WAIT_S - 10,
            )
            states = rows(pg_url, "SELECT seq, state FROM items WHERE state <> 'sent'")
            assert {seq for seq, _ in states} == b_items
            assert {state for _, state in states} == {"in_flight"}, "settled by query only"
            query_hold.set()
            code, out = finish(first)
            assert code == 0, out
    assert rows(pg_url, "SELECT state FROM runs") == [("completed",)]
    assert len(receiver.commits) == ROWS
    assert set(receiver.commits.values()) == {1}, "every key committed once"
