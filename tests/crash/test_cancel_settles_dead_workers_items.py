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
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from notifier.channels import Ready, always
from notifier.cli import cli
from notifier.domain import clock
from notifier.domain.answers import Receipt
from notifier.domain.intent import Intent
from notifier.domain.records import PendingKind
from notifier.domain.state_machine import ItemTrigger, RunState
from notifier.engine.coordination import RunOptions, Shared
from notifier.engine.judging import Progress
from notifier.engine.run_control import RunControl
from notifier.engine.settle_by_query import not_found_counts_from, settle_items

from ..conftest import Workspace, make_rows, wait_for
from ..engine.test_pg_concurrent_writes import plan, worker
from ..receiver import Receiver, receiving, released, webhook_config
from ..support.background import meanwhile
from ..support.ledger import Forge
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
    for holder, item_id in rows(db, sql, (run_id,)):
        held.setdefault(holder, set()).add(item_id)
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
        answer_hold = receiver.answer_hold

        def kill_b_once_the_cancel_is_recorded() -> None:
            try:
                wait_for(
                    lambda: (
                        rows(db, "SELECT cancel_requested_at IS NOT NULL FROM runs") == [(True,)]
                    ),
                    "the cancel recorded",
                )
                b.send_signal(signal.SIGKILL)
                b.wait()
            finally:
                answer_hold.set()

        # The cancel in-process: it waits for A to confirm while B is killed and the
        # answers come back.
        with meanwhile(kill_b_once_the_cancel_is_recorded):
            cancel = CliRunner().invoke(
                cli, ["--db", db, "cancel", "k1", "--report", "--format", "json", "--wait", "60"],
                catch_exceptions=False,
            )  # fmt: skip
        out, err, code = cancel.stdout, cancel.stderr, cancel.exit_code
        a_code, a_out = finish(a)
        assert a_code == 3, a_out  # the worker a cancel stopped: the cancel's own code
    assert "cancelled" in err, err
    report = json.loads(out)
    return delivered, never_left, report, a_out, code


def _holding(db: str, receiver: Receiver, pid: int, sent: int, held: int, who: str) -> str:
    """Until the worker of process `pid` holds `held` items in flight, `sent` of them at the
    receiver; its worker id."""
    ((holder,),) = _wait_rows(db, "SELECT worker_id FROM workers WHERE pid = ?", (pid,))

    def holding() -> bool:
        items = _in_flight_of(db, "k1").get(holder, set())
        return len(items) == held and len(_arrived(receiver, items)) == sent

    wait_for(holding, f"{who} holds {sent} requests at the receiver, {held} items in flight")
    return str(holder)


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


# ---------------------------------------------------------------------- in process


class AskedByKey:
    """A downstream that is only asked about (a cancel sends nothing): the keys of
    `delivered` are found, every other is not (404). Each question is noted with the
    moment it came, on the wall clock."""

    name = "outbox"  # the channel the planned items name
    idempotent = False
    queryable = True
    thread_safe = True
    timeout_s = 0.6  # with query_delay_s: the window before a 404 counts
    query_delay_s = 0.2
    suppress_on_reject = False
    max_in_flight: int | None = None

    def __init__(self, delivered: set[str]) -> None:
        self.delivered = delivered
        self.asked: list[tuple[str, datetime]] = []

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        raise AssertionError(f"sent {intent.item_id} at cancel")

    def query(self, key: str) -> Receipt | None:
        self.asked.append((key, clock.now()))
        return Receipt("r-" + key) if key in self.delivered else None

    def close(self) -> None:
        pass


def _forge(db: str) -> Forge:
    """The changes a test makes behind notifier's back, on the schema at `db`."""
    return Workspace(Path("."), url=db).forge


def _dies(db: str, worker_id: str) -> None:
    """`worker_id`'s lease (from another host) expires: it counts as dead from now on."""
    _forge(db).worker_lease_expires(worker_id, clock.iso(clock.later(-60)))


@pytest.mark.timeout(60)
def test_the_last_worker_settles_every_item_left_mid_request_before_it_closes(
    ws: Workspace, pg_url: str
) -> None:
    """In process, the last live worker A of a cancelled run closes it (Shared.finish_cancel)
    over three kinds of items a dead worker left: B's, still in flight (adopted now); C's
    that A adopted earlier and never asked about, the run stopping; and one of C's that A
    asked about too early (a 404 within the window: unknown). Each is asked about, and
    asked again once its 404 counts: the delivered end sent, the others pending and proven
    undelivered, their deciding 404 heard only after their window closed; nothing is left
    in flight or unknown, and the closing line says nothing may have been delivered."""
    plan(ws, pg_url, "k2", "batch.csv", 1)
    _forge(pg_url).run_state("k2", "running")
    a, a_version = worker(pg_url, "k2", "worker-a")
    b, b_version = worker(pg_url, "k2", "worker-b")
    c, c_version = worker(pg_url, "k2", "worker-c")
    try:
        b_items = b.ledger.claim("k2", b_version, 4)  # seqs 1-4
        c_items = c.ledger.claim("k2", c_version, 3)  # seqs 5-7
        keys = {item.seq: item.idempotency_key for item in [*b_items, *c_items]}
        channel = AskedByKey({keys[1], keys[2], keys[6]})
        said: list[str] = []
        coord = Shared(
            "worker-a", a, "k2", {"outbox": channel}, a_version, Progress(said.append),
            RunOptions(concurrency=8), RunControl(),
        )  # fmt: skip
        _dies(pg_url, "worker-c")
        assert [item.seq for item in coord.adopt()] == [5, 6, 7]  # mid-run, as watch() does
        [early] = settle_items(
            a, "k2", coord.channels, a_version, [a.queries.item("k2", 7)], said.append
        )
        assert early.outcome is not None and early.outcome.trigger == ItemTrigger.LOSE
        _dies(pg_url, "worker-b")
        result = coord.finish_cancel()
        states = dict(rows(pg_url, "SELECT seq, state FROM items WHERE run_id = 'k2' AND seq <= 7"))
        kinds = a.queries.pending_kinds("k2")
        attempts = {seq: a.queries.attempts("k2", seq) for seq in range(1, 8)}
    finally:
        for store in (a, b, c):
            store.close()
    assert result.state is RunState.CANCELLED
    assert rows(pg_url, "SELECT state FROM runs WHERE run_id = 'k2'") == [("cancelled",)]
    assert {seq: states[seq] for seq in (1, 2, 6)} == {1: "sent", 2: "sent", 6: "sent"}
    assert {seq: states[seq] for seq in (3, 4, 5, 7)} == dict.fromkeys((3, 4, 5, 7), "pending")
    assert {kinds[seq] for seq in (3, 4, 5, 7)} == {PendingKind.RETRY_WAITING}
    for seq in (3, 4, 5, 7):
        # The 404 that decided it came once the window of its interrupted attempt closed.
        window = not_found_counts_from(channel, attempts[seq])
        last = max(at for key, at in channel.asked if key == keys[seq])
        assert window is not None and last >= window, (seq, last, window)
    assert "in flight" not in result.reason and "maybe delivered" not in result.reason
    assert result.counts.in_flight == result.counts.unknown == 0


@pytest.mark.timeout(60)
def test_the_last_worker_asks_again_about_items_asked_too_early_with_nothing_in_flight(
    ws: Workspace, pg_url: str
) -> None:
    """In process: a dead worker's items that A adopted mid-run and asked about too early
    (unknown) are asked again when A closes the cancelled run, although A holds nothing in
    flight then: none is left unknown, none sent to a manual decision."""
    plan(ws, pg_url, "k3", "batch.csv", 1)
    _forge(pg_url).run_state("k3", "running")
    a, a_version = worker(pg_url, "k3", "worker-a")
    c, c_version = worker(pg_url, "k3", "worker-c")
    try:
        c.ledger.claim("k3", c_version, 3)  # seqs 1-3
        channel = AskedByKey(set())  # none delivered: each 404 proves it once it counts
        said: list[str] = []
        coord = Shared(
            "worker-a", a, "k3", {"outbox": channel}, a_version, Progress(said.append),
            RunOptions(concurrency=8), RunControl(),
        )  # fmt: skip
        _dies(pg_url, "worker-c")
        assert [item.seq for item in coord.adopt()] == [1, 2, 3]  # mid-run, as watch() does
        early = settle_items(
            a, "k3", coord.channels, a_version, [a.queries.item("k3", s) for s in (1, 2, 3)],
            said.append,
        )  # fmt: skip
        assert {s.outcome.trigger for s in early if s.outcome} == {ItemTrigger.LOSE}
        assert not a.leases.held_in_flight("k3", "worker-a")  # nothing in flight at the close
        result = coord.finish_cancel()
        states = dict(rows(pg_url, "SELECT seq, state FROM items WHERE run_id = 'k3' AND seq <= 3"))
    finally:
        a.close()
        c.close()
    assert states == {1: "pending", 2: "pending", 3: "pending"}, states
    assert result.counts.unknown == 0, result.reason
