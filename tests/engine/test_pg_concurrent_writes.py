"""PostgreSQL workers write concurrently: no lock of the whole schema. Two
workers' group commits on one run overlap and commit contiguous, unique event numbers with no
lost update; writes to two runs never wait for each other; a worker's fence still holds while
another reaps it. Each test drives the store's real group commit (`Ledger.step`, as the
pipeline's committer calls it) on connections of its own, holding one transaction open at
its COMMIT while the other writes. The sequential fence tests are test_workers.py's
test_a_reaped_worker_writes_nothing and test_chaos_three_workers_killed_at_random_each_key_
committed_once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

import psycopg
import pytest
from click.testing import CliRunner

from notifier.cli import cli
from notifier.domain import clock
from notifier.domain.records import AttemptOutcome, Item, Outcome
from notifier.domain.state_machine import ItemState, ItemTrigger
from notifier.engine.membership import holder_alive
from notifier.store import LeaseLost, Store
from notifier.store.postgres import PostgresEngine

from ..conftest import Workspace, make_rows, postgres_schema
from ..support.ledger import Ledger

# How long a writer may wait for a lock before its write fails: far below the store's 10 s,
# so a write that the other transaction blocks fails the test quickly instead of hanging.
LOCK_WAIT = "2s"
# A bound on waiting for the other thread to reach a point it reaches at once when nothing
# blocks it.
BOUND_S = 20.0


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    """A schema of its own on the tests' PostgreSQL server (skips without one)."""
    with postgres_schema(postgres_server) as url:
        yield url


def plan(ws: Workspace, db: str, run_id: str, csv: str, start: int) -> None:
    """A run of 12 items, planned by the real CLI and left awaiting approval (nothing sent)."""
    ws.write_csv(csv, make_rows(12, start=start))
    done = CliRunner().invoke(
        cli, ["--db", db, "send", csv, "--run-id", run_id, "--require-approval"],
        catch_exceptions=False,
    )  # fmt: skip
    assert done.exit_code in (0, 3), done.output


def ledger(db: str) -> Ledger:
    """The typed read model (support/ledger.py) of the schema `db` names."""
    return Ledger(lambda sql, params: rows(db, sql, tuple(params)))


def rows(db: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(db) as conn:
        return [tuple(r) for r in conn.execute(sql.replace("?", "%s"), params)]


def worker(db: str, run_id: str, token: str) -> tuple[Store, int]:
    """A store connection working `run_id` under a worker lease of its own, as `worker`
    does, that gives up on any lock after LOCK_WAIT."""
    owner = {"host": f"host-{token}", "pid": 1, "started": None, "token": token}
    store = Store.open(db).for_worker(token)  # one connection, closed with the worker store
    version = store.leases.join_run(run_id, owner, 60, holder_alive)
    store.engine.execute(f"SET lock_timeout = '{LOCK_WAIT}'")
    return store, version


def acks(seqs: list[int]) -> list[Outcome]:
    """Answered sends, as the pipeline records them (Ledger._record_acks)."""
    return [
        Outcome(seq, ItemTrigger.ACK, attempt_outcome=AttemptOutcome.SENT, receipt_id=f"r-{seq}",
                receipt_source="send", expected=ItemState.IN_FLIGHT, finished_at=clock.now_iso())
        for seq in seqs
    ]  # fmt: skip


class HeldAtCommit:
    """`store`'s next write transaction stops just before its COMMIT (every statement of the
    group commit has run) until `release`; `reached` is set when it gets there. `then` runs
    there first, in the transaction."""

    def __init__(
        self,
        store: Store,
        then: Callable[[], object] = lambda: None,
        released: threading.Event | None = None,
    ) -> None:
        self.reached = threading.Event()
        self.released = released or threading.Event()  # one event releases several at once
        commit = store.core._commit

        def held() -> None:
            then()
            self.reached.set()
            assert self.released.wait(BOUND_S)
            commit()

        store.core._commit = held  # type: ignore[method-assign]


def until(condition: Callable[[], bool]) -> bool:
    """Whether `condition` came true within BOUND_S (polled: it is another server session's)."""
    deadline = time.monotonic() + BOUND_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def waiting_on_a_lock(db: str, store: Store) -> bool:
    """Whether `store`'s server session is waiting for a lock another session holds."""
    assert isinstance(store.engine, PostgresEngine)
    pid = store.engine.raw.info.backend_pid
    sql = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?"
    return rows(db, sql, (pid,)) == [("Lock",)]


def in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """`work` on a thread of its own; its result, or what it raised, lands in the list."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def assert_history_whole(db: str, run_id: str) -> None:
    """Event numbers 1..n with none twice, and the run's counters equal to its items."""
    numbers = [n for (n,) in rows(db, "SELECT seq_no FROM events WHERE run_id = ? ORDER BY seq_no",
                                  (run_id,))]  # fmt: skip
    assert numbers == list(range(1, len(numbers) + 1))
    counted = rows(db, "SELECT state, n FROM run_counts WHERE run_id = ? AND n > 0 ORDER BY state",
                   (run_id,))  # fmt: skip
    assert dict(counted) == ledger(db).state_counts(run_id)


def test_two_group_commits_on_one_run_overlap(ws: Workspace, pg_url: str) -> None:
    """While one worker's group commit of a run is open (its acks and claim written), a
    second worker's group commit of the same run writes and commits; both then hold: every
    ack and claim recorded once, events numbered 1..n, counters equal to the items."""
    plan(ws, pg_url, "one", "batch.csv", 1)
    a, a_version = worker(pg_url, "one", "worker-a")
    b, b_version = worker(pg_url, "one", "worker-b")
    try:
        assert [i.seq for i in a.ledger.claim("one", a_version, 3)] == [1, 2, 3]
        assert [i.seq for i in b.ledger.claim("one", b_version, 3)] == [4, 5, 6]
        held = HeldAtCommit(a)
        thread, a_claimed = in_thread(lambda: a.ledger.step("one", a_version, acks([1, 2, 3]), 2))
        assert held.reached.wait(BOUND_S)
        try:
            # A's transaction is open, its items written and its claim's rows locked: B's
            # acks move other rows, and its claim skips A's.
            b_claimed = b.ledger.step("one", b_version, acks([4, 5, 6]), 2)
        finally:
            held.released.set()
            thread.join(BOUND_S)
        assert [i.seq for i in b_claimed] == [9, 10]
        assert [[i.seq for i in claimed] for claimed in a_claimed] == [[7, 8]]  # type: ignore[attr-defined]
    finally:
        a.close()
        b.close()
    states = [(i.seq, i.state, i.worker_id) for i in ledger(pg_url).items("one") if i.seq <= 10]
    assert states == [(s, "sent", "worker-a") for s in (1, 2, 3)] + [
        (s, "sent", "worker-b") for s in (4, 5, 6)
    ] + [(7, "in_flight", "worker-a"), (8, "in_flight", "worker-a"),
         (9, "in_flight", "worker-b"), (10, "in_flight", "worker-b")]  # fmt: skip
    assert ledger(pg_url).receipt_count() == 6
    kinds = Counter(e.kind for e in ledger(pg_url).events(run_id="one"))
    assert (kinds["ack"], kinds["start"]) == (6, 10)
    assert_history_whole(pg_url, "one")


# Rounds of two commits released at once: a single round could find one COMMIT done before
# the other's numbering reads the last event, and pin nothing.
NUMBERING_ROUNDS = 5


def test_two_commits_of_one_run_numbering_at_once_both_commit(ws: Workspace, pg_url: str) -> None:
    """Two workers' group commits of one run, both held just before their COMMIT (every
    item write made, the events still to number) and released together, round after round:
    the `runs` row each takes at COMMIT numbers one transaction's events after the other's,
    so both commit (never a clash on events(run_id, seq_no), which the process would exit 1
    on) and the run's events are numbered 1..n with no gap."""
    plan(ws, pg_url, "both", "batch.csv", 1)
    a, a_version = worker(pg_url, "both", "worker-a")
    b, b_version = worker(pg_url, "both", "worker-b")
    try:
        workers = [(a, a_version), (b, b_version)]
        claimed = [store.ledger.claim("both", version, 1) for store, version in workers]
        commits = [store.core._commit for store, _ in workers]

        def step(store: Store, version: int, items: list[Item]) -> Callable[[], object]:
            return lambda: store.ledger.step("both", version, acks([i.seq for i in items]), 1)

        for _ in range(NUMBERING_ROUNDS):
            release = threading.Event()
            for (store, _), commit in zip(workers, commits, strict=True):
                store.core._commit = commit  # type: ignore[method-assign]
            held = [HeldAtCommit(store, released=release) for store, _ in workers]
            threads = [
                in_thread(step(store, version, items))
                for (store, version), items in zip(workers, claimed, strict=True)
            ]
            try:
                assert all(h.reached.wait(BOUND_S) for h in held)
            finally:
                release.set()
                for thread, _ in threads:
                    thread.join(BOUND_S)
            results = [result for _, result in threads]
            assert all(len(r) == 1 and isinstance(r[0], list) for r in results), results
            claimed = [cast(list[Item], result[0]) for result in results]
    finally:
        a.close()
        b.close()
    assert ledger(pg_url).state_counts("both").get("sent") == 2 * NUMBERING_ROUNDS
    assert len(ledger(pg_url).events("ack", run_id="both")) == 2 * NUMBERING_ROUNDS
    assert_history_whole(pg_url, "both")


def test_writes_to_two_runs_never_wait_for_each_other(ws: Workspace, pg_url: str) -> None:
    """A group commit of one run, held open at its COMMIT with the run's row taken (as its
    COMMIT takes it), keeps a group commit of another run in the same schema from nothing:
    the second writes, numbers its events and commits meanwhile."""
    plan(ws, pg_url, "left", "left.csv", 1)
    plan(ws, pg_url, "right", "right.csv", 101)
    a, a_version = worker(pg_url, "left", "worker-a")
    b, b_version = worker(pg_url, "right", "worker-b")
    try:
        a.ledger.claim("left", a_version, 2)
        b.ledger.claim("right", b_version, 2)
        held = HeldAtCommit(a, then=lambda: a.core.locked_run("left"))
        thread, _ = in_thread(lambda: a.ledger.step("left", a_version, acks([1, 2]), 1))
        assert held.reached.wait(BOUND_S)
        try:
            assert [i.seq for i in b.ledger.step("right", b_version, acks([1, 2]), 1)] == [3]
        finally:
            held.released.set()
            thread.join(BOUND_S)
    finally:
        a.close()
        b.close()
    for run_id in ("left", "right"):
        items = [(i.seq, i.state) for i in ledger(pg_url).items(run_id) if i.seq <= 3]
        assert items == [(1, "sent"), (2, "sent"), (3, "in_flight")]
        assert_history_whole(pg_url, run_id)


def test_a_reap_skips_a_worker_whose_commit_is_open_and_takes_it_after(
    ws: Workspace, pg_url: str
) -> None:
    """A worker taken for dead while its group commit (a claim) is open: a live worker's
    reap neither waits for that commit nor lands under it (it skips that worker, and its
    own writes go on); once the commit, which the lease still covered, has landed, the next
    reap fences it out and adopts everything it holds in flight (the new claim too), never
    an item it settled."""
    plan(ws, pg_url, "fence", "batch.csv", 1)
    old, old_version = worker(pg_url, "fence", "worker-old")
    new, new_version = worker(pg_url, "fence", "worker-new")

    def alive(owner: dict[str, Any], _expires: str | None) -> bool:
        return bool(owner["token"] != "worker-old")  # the old worker counts as dead

    try:
        assert [i.seq for i in old.ledger.claim("fence", old_version, 4)] == [1, 2, 3, 4]
        assert old.ledger.step("fence", old_version, acks([1, 2]), 0) == []
        held = HeldAtCommit(old)
        thread, claimed = in_thread(lambda: old.ledger.step("fence", old_version, [], 2))
        assert held.reached.wait(BOUND_S)
        reaper, skipped = in_thread(
            lambda: new.leases.adopt_orphans("fence", "worker-new", new_version, alive).seqs
        )
        reaper.join(BOUND_S)
        done_while_open = not reaper.is_alive()
        live_while_open = rows(pg_url, "SELECT state FROM workers WHERE worker_id = 'worker-old'")
        held.released.set()
        thread.join(BOUND_S)
        adopted = new.leases.adopt_orphans("fence", "worker-new", new_version, alive).seqs
    finally:
        old.close()
        new.close()
    assert done_while_open, "the reap waited for the open commit"
    assert skipped == [[]] and live_while_open == [("live",)]
    assert [[i.seq for i in items] for items in claimed] == [[5, 6]]  # type: ignore[attr-defined]
    assert adopted == [3, 4, 5, 6]
    assert [(i.seq, i.state, i.worker_id) for i in ledger(pg_url).items("fence") if i.seq <= 6] == [
        (1, "sent", "worker-old"), (2, "sent", "worker-old"),
        *[(seq, "in_flight", "worker-new") for seq in (3, 4, 5, 6)],
    ]  # fmt: skip
    assert_history_whole(pg_url, "fence")


def test_two_workers_reaping_each_other_never_wait_on_each_other(
    ws: Workspace, pg_url: str
) -> None:
    """Two live workers that each take the other for dead and reap it at the same moment:
    the one whose transaction comes second finds the other's lease row held by the first's
    open transaction and skips it (no wait, no deadlock, no crash); the first then reaps
    the second and adopts its items, and the second's next fenced write stops it with
    LeaseLost."""
    plan(ws, pg_url, "mutual", "batch.csv", 1)
    x, x_version = worker(pg_url, "mutual", "worker-x")
    y, y_version = worker(pg_url, "mutual", "worker-y")
    try:
        x.ledger.claim("mutual", x_version, 2)
        y.ledger.claim("mutual", y_version, 2)
        fenced, go = threading.Event(), threading.Event()
        check = x.core._check_fence

        def held(run_id: str | None, version: int, row: Any) -> None:
            check(run_id, version, row)  # X's lease row is now held (shared) to its COMMIT
            if not fenced.is_set():
                fenced.set()
                assert go.wait(BOUND_S)

        x.core._check_fence = held  # type: ignore[method-assign,assignment]

        def reaping(store: Store, me: str, version: int, other: str) -> Callable[[], object]:
            def alive(owner: dict[str, Any], _expires: str | None) -> bool:
                return bool(owner["token"] != other)  # each takes the other for dead

            return lambda: store.leases.adopt_orphans("mutual", me, version, alive).seqs

        x_thread, x_result = in_thread(reaping(x, "worker-x", x_version, "worker-y"))
        assert fenced.wait(BOUND_S)
        y_thread, y_result = in_thread(reaping(y, "worker-y", y_version, "worker-x"))
        try:
            y_thread.join(BOUND_S)
            y_done_while_x_open = not y_thread.is_alive()
        finally:
            go.set()
            x_thread.join(BOUND_S)
        stopped: list[BaseException] = []
        try:
            y.ledger.step("mutual", y_version, [], 1)
        except LeaseLost as exc:
            stopped.append(exc)
    finally:
        x.close()
        y.close()
    assert y_done_while_x_open, "Y's reap waited for X's open transaction"
    assert y_result == [[]], "Y skipped X, whose transaction was open"
    assert x_result == [[3, 4]], "X reaped Y and adopted its items"
    assert len(stopped) == 1, "Y's next fenced write found it reaped"
    assert sorted(rows(pg_url, "SELECT worker_id, state FROM workers")) == [
        ("worker-x", "live"), ("worker-y", "reaped"),
    ]  # fmt: skip
    assert_history_whole(pg_url, "mutual")
