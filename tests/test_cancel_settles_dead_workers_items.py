"""`cancel` while one worker of a shared run lives and another was killed -9 with items in
flight: the live worker closes the run, and before it does it settles the dead worker's
items, by query where the channel can be asked (delivered → sent; never left → proven
undelivered once a 404 counts), else as unknown; never left in flight, never reported
pending while they may have been delivered. Real `notifier` processes on a real PostgreSQL
server, against a scripted receiver on 127.0.0.1."""

from __future__ import annotations

import json
import re
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
# The timeout is longer than A's answers are held (while a `cancel` process starts).
TIMEOUT_S, QUERY_DELAY_S = 6, 0.5


def _in_flight_of(db: str, run_id: str) -> dict[str, set[str]]:
    """worker_id → the item ids it holds in flight."""
    held: dict[str, set[str]] = {}
    sql = "SELECT worker_id, item_id FROM items WHERE run_id = ? AND state = 'in_flight'"
    for worker, item_id in rows(db, sql, (run_id,)):
        held.setdefault(worker, set()).add(item_id)
    return held


def _cancel_over_a_dead_worker(
    ws: Workspace, db: str, receiver: Receiver, *, queryable: bool, idempotent: bool = False
) -> tuple[set[str], set[str], dict[str, Any], str, int]:
    """B (`send`, N) plans the run; its N requests are delivered, their answers held. Once B
    holds them (and, where the channel can be asked, 3N items claimed ahead, which never
    left) it is stopped (SIGSTOP: frozen as it is, still alive), and A (`worker`, N) joins
    and holds N requests of its own at the receiver, answers held too. Then `cancel
    --report --format json` is asked for, B is killed -9, and the answers come back: A
    closes the run. Returns B's delivered and never-left item ids, cancel's report, A's
    output and cancel's exit code."""
    assert receiver.answer_hold is not None
    (ws.path / "notifier.toml").write_text(
        webhook_config(
            receiver, idempotent=idempotent, status=queryable, timeout=TIMEOUT_S,
            query_delay=QUERY_DELAY_S,
        )
    )  # fmt: skip
    ws.write_csv("batch.csv", make_rows(ROWS))
    [b] = fleet(ws, db, "k1", 1, N)
    processes = [b]
    with released(processes, receiver.answer_hold):
        ahead = 3 * N if queryable else 0
        b_id = _holding(db, receiver, b.pid, N, N + ahead, "B")
        b.send_signal(signal.SIGSTOP)
        b_items = _in_flight_of(db, "k1")[b_id]
        delivered = _arrived(receiver, b_items)
        never_left = b_items - delivered
        assert len(never_left) == ahead
        a = notifier(ws, db, "worker", "k1", "--concurrency", str(N))
        processes.append(a)
        _holding(db, receiver, a.pid, N, N + ahead, "A")
        cancel = subprocess.Popen(
            [sys.executable, "-m", "notifier", "--db", db, "cancel", "k1", "--report",
             "--format", "json", "--wait", "60"],
            cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        processes.append(cancel)
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
        assert a_code == 3, a_out  # the worker a cancel stopped: the cancel's own code
    assert "cancelled" in err, err
    report = json.loads(out)
    return delivered, never_left, report, a_out, code


def _holding(db: str, receiver: Receiver, pid: int, sent: int, held: int, who: str) -> str:
    """Until the worker of process `pid` holds `held` items in flight, `sent` of them at the
    receiver; its worker id."""
    ((worker,),) = _wait_rows(db, "SELECT worker_id FROM workers WHERE pid = ?", (pid,))

    def holding() -> bool:
        items = _in_flight_of(db, "k1").get(worker, set())
        return len(items) == held and len(_arrived(receiver, items)) == sent

    wait_for(holding, f"{who} holds {sent} requests at the receiver, {held} items in flight")
    return str(worker)


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
@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "dedupes"])
def test_cancel_settles_a_dead_workers_items_by_query_before_closing(
    ws: Workspace, pg_url: str, idempotent: bool
) -> None:
    """B dies with N requests delivered (answers not back) and 3N items claimed ahead that
    never left. The live worker A closes the cancelled run only after asking about every
    one of them: the delivered end sent (found by query, not sent again), the never-left
    end pending and proven undelivered (their 404 asked for again once timeout + query_delay
    passed); nothing is left in flight, nothing reported maybe delivered; every key
    committed once. Alike on a channel that dedupes by key, where a 404 that comes early
    leaves an item pending but maybe delivered until it is asked again."""
    receiver = Receiver(answer_hold=threading.Event())
    with receiving(receiver):
        delivered, never_left, report, a_out, code = _cancel_over_a_dead_worker(
            ws, pg_url, receiver, queryable=True, idempotent=idempotent
        )
    assert report["state"] == "cancelled"
    states = {i["id"]: (i["state"], i["pending_kind"]) for i in report["items"]}
    assert {states[i] for i in delivered} == {("sent", None)}, states
    assert {states[i] for i in never_left} == {("pending", "retry_waiting")}, states
    assert report["counts"]["in_flight"] == 0
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
    # A's closing line counts them unknown too (with any of A's own whose answer was late).
    closing = re.search(r"(\d+) unknown", a_out.splitlines()[-1])
    assert closing is not None, a_out
    assert int(closing[1]) == report["counts"]["unknown"] >= N, a_out
    assert "maybe delivered" not in a_out, a_out
    assert code == 3, report
