"""`cancel` while one worker of a shared run lives and another was killed -9 with items in
flight: the live worker closes the run, and before it does it settles the dead worker's
items, by query where the channel can be asked (delivered → sent; never left → proven
undelivered once a 404 counts), else as unknown; never left in flight, never reported
pending while they may have been delivered. Real `notifier` processes on a real PostgreSQL
server, against a scripted receiver on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from .conftest import Workspace, make_rows, wait_for
from .receiver import Receiver, receiving, released, webhook_config
from .test_workers import finish, fleet, notifier, pg_url, rows

__all__ = ["pg_url"]  # the fixture, from test_workers

ROWS = 200
N = 8  # each worker's --concurrency; with a status_url it claims 3N more ahead
# The webhook's timeout and query_delay: the window after which a 404 proves a request of
# the dead worker never arrived, which the live worker waits out before it closes the run.
TIMEOUT_S, QUERY_DELAY_S = 3, 0.5


def _in_flight_of(db: str, run_id: str) -> dict[str, set[str]]:
    """worker_id → the item ids it holds in flight."""
    held: dict[str, set[str]] = {}
    sql = "SELECT worker_id, item_id FROM items WHERE run_id = ? AND state = 'in_flight'"
    for worker, item_id in rows(db, sql, (run_id,)):
        held.setdefault(worker, set()).add(item_id)
    return held


def _cancel_over_a_dead_worker(
    ws: Workspace, db: str, receiver: Receiver, *, queryable: bool
) -> tuple[set[str], set[str], dict[str, Any], str, int]:
    """A (`send`) and B (`worker`), each at N, both with every request delivered and its
    answer held. Once B holds N requests at the receiver (and, where the channel can be
    asked, items claimed ahead, which never left), `cancel --report --format json` is
    asked for, B is killed -9, then the answers come back. Returns B's delivered and
    never-left item ids, cancel's report, A's output and cancel's exit code."""
    assert receiver.answer_hold is not None
    (ws.path / "notifier.toml").write_text(
        webhook_config(
            receiver, idempotent=False, status=queryable, timeout=TIMEOUT_S,
            query_delay=QUERY_DELAY_S,
        )
    )  # fmt: skip
    ws.write_csv("batch.csv", make_rows(ROWS))
    [a] = fleet(ws, db, "k1", 1, N)
    b = notifier(ws, db, "worker", "k1", "--concurrency", str(N))
    with released([a, b], receiver.answer_hold):
        ((b_id,),) = _wait_rows(db, "SELECT worker_id FROM workers WHERE pid = ?", (b.pid,))
        ahead = 3 * N if queryable else 0
        wait_for(
            lambda: (
                len(_arrived(receiver, _in_flight_of(db, "k1").get(b_id, set()))) == N
                and len(_in_flight_of(db, "k1").get(b_id, set())) == N + ahead
            ),
            "B holds N requests at the receiver and its items claimed ahead",
        )
        b_items = _in_flight_of(db, "k1")[b_id]
        delivered = _arrived(receiver, b_items)
        never_left = b_items - delivered
        assert len(never_left) == ahead
        cancel = subprocess.Popen(
            [sys.executable, "-m", "notifier", "--db", db, "cancel", "k1", "--report",
             "--format", "json", "--wait", "60"],
            cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for(
            lambda: rows(db, "SELECT cancel_requested_at IS NOT NULL FROM runs") == [(True,)],
            "the cancel recorded",
        )
        b.send_signal(signal.SIGKILL)
        b.wait()
        receiver.answer_hold.set()
        out, err = cancel.communicate(timeout=60)
        code = cancel.returncode
        a_code, a_out = finish(a)
        assert a_code in (0, 3), a_out
    assert "cancelled" in err, err
    report = json.loads(out)
    return delivered, never_left, report, a_out, code


def _wait_rows(db: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []

    def look() -> bool:
        found[:] = rows(db, sql, params)
        return bool(found)

    wait_for(look, sql)
    return found


def _arrived(receiver: Receiver, item_ids: set[str]) -> set[str]:
    with receiver.lock:
        return {a.item_id for a in receiver.arrivals} & item_ids


@pytest.mark.timeout(90)
def test_cancel_settles_a_dead_workers_items_by_query_before_closing(
    ws: Workspace, pg_url: str
) -> None:
    """B dies with N requests delivered (answers not back) and 3N items claimed ahead that
    never left. The live worker A closes the cancelled run only after asking about every
    one of them: the delivered end sent (found by query, not sent again), the never-left
    end pending and proven undelivered (their 404 asked for again once timeout + query_delay
    passed), none in flight or unknown, none reported maybe delivered; every key committed
    once."""
    receiver = Receiver(answer_hold=threading.Event())
    with receiving(receiver):
        delivered, never_left, report, a_out, code = _cancel_over_a_dead_worker(
            ws, pg_url, receiver, queryable=True
        )
    assert report["state"] == "cancelled"
    states = {i["id"]: (i["state"], i["pending_kind"]) for i in report["items"]}
    assert {states[i] for i in delivered} == {("sent", None)}, states
    assert {states[i] for i in never_left} == {("pending", "retry_waiting")}, states
    assert report["counts"]["in_flight"] == report["counts"]["unknown"] == 0
    assert not [i for i in report["items"] if i["pending_kind"] == "maybe_delivered"]
    assert "maybe delivered" not in a_out, a_out
    assert code == 3, report  # a cancelled run with items never sent: exit 3 (contract)
    assert set(receiver.commits.values()) == {1}, "every key committed once"


@pytest.mark.timeout(90)
def test_cancel_reports_a_dead_workers_unqueryable_items_unknown(
    ws: Workspace, pg_url: str
) -> None:
    """The same with a webhook that cannot be asked (no status_url, so nothing is claimed
    ahead): B's N delivered requests cannot be settled by query, so the closed run reports
    them unknown (A's closing line too), never in flight, never pending."""
    receiver = Receiver(answer_hold=threading.Event())
    with receiving(receiver):
        delivered, never_left, report, a_out, code = _cancel_over_a_dead_worker(
            ws, pg_url, receiver, queryable=False
        )
    assert never_left == set()
    assert report["state"] == "cancelled"
    states = {i["id"]: i["state"] for i in report["items"]}
    assert {states[i] for i in delivered} == {"unknown"}, states
    assert report["counts"]["in_flight"] == 0
    assert report["counts"]["unknown"] == N
    assert f"{N} unknown" in a_out, a_out
    assert "maybe delivered" not in a_out, a_out
    assert code == 3, report
