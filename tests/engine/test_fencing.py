"""Whose lease fences a store's writes is fixed when the store is made: a store
made for a worker (Store.for_worker, as SharedLease makes its own) is fenced by that
worker's lease, and the store it was made from stays fenced by the run's lease. Through the
real CLI and the real database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from notifier.domain import clock
from notifier.domain.records import Run
from notifier.domain.retry import RetryPolicy
from notifier.engine.membership import SharedLease, holder_alive
from notifier.engine.run_control import RunControl
from notifier.engine.runner import Runner, RunOptions
from notifier.store import LeaseHeld, LeaseLost, LossCause, RunFence, Store, WorkerFence

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import WAIT_S, Receiver, receiving, webhook_config
from ..support.background import meanwhile
from ..support.held import Holding

_NOBODY = {"host": "elsewhere", "pid": 1, "started": None, "token": "run-holder"}


def planned(ws: Workspace, items: int) -> Run:
    """Run f1, planned by the CLI with `items` items, held for approval (nothing sent)."""
    ws.write_csv("batch.csv", make_rows(items))
    result = ws.invoke("send", "batch.csv", "--run-id", "f1", "--require-approval")
    assert result.exit_code in (0, 3), result.output
    store = Store.open(ws.db)
    try:
        run = store.core.get_run("f1")
    finally:
        store.close()
    assert run.state.value == "awaiting_approval"
    return run


def run_lease(store: Store) -> int:
    """Take the run's lease and let it go again (its version stays the fence), twice: the
    run's version is then above every worker lease's first version (1), so a store fenced
    by the wrong one of the two cannot pass by coincidence."""
    version = 0
    for _ in range(2):
        version = store.leases.acquire_lease("f1", _NOBODY, 30, lambda owner, at: False)
        store.leases.release_lease("f1", version)
    assert version > 1
    return version


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_store_made_for_a_worker_leaves_its_origin_fenced_by_the_run_lease(
    ws: Workspace,
) -> None:
    """A store made for a worker with no live lease of its own has every fenced write
    refused (LeaseLost, nothing written), while the store it was made from, and that
    store's secondary connection, still write under the run's lease."""
    planned(ws, 3)
    store = Store.open(ws.db)
    try:
        version = run_lease(store)
        worker = store.for_worker("no-such-worker")
        assert worker.fencing == WorkerFence("no-such-worker")
        with pytest.raises(LeaseLost):
            worker.ledger.claim("f1", version, 1)
        assert store.fencing == RunFence()
        assert [item.seq for item in store.ledger.claim("f1", version, 1)] == [1]
        secondary = store.secondary()
        try:
            assert secondary.fencing == RunFence()
            assert [item.seq for item in secondary.ledger.claim("f1", version, 1)] == [2]
        finally:
            secondary.close()
    finally:
        store.close()
    assert [(i.seq, i.state, i.worker_id) for i in ws.ledger.items()] == [
        (1, "in_flight", None),
        (2, "in_flight", None),
        (3, "pending", None),
    ]


# Only PostgreSQL lets workers share a run (Store.shares_runs).
@pytest.mark.parametrize("ws", ["postgres"], indirect=True)
@pytest.mark.timeout(60)
def test_a_worker_lease_fences_its_own_store_not_the_one_it_was_taken_on(
    ws: Workspace,
) -> None:
    """While a worker lease is held, its store and that store's secondary are fenced by it
    (their claims record the worker; once another worker reaps it, they are refused), and
    the store the lease was taken on stays fenced by the run's lease (its claims record no
    worker; the worker's version is refused there)."""
    planned(ws, 4)
    store = Store.open(ws.db)
    reaper = Store.open(ws.db).for_worker("reaper")  # one connection, closed as `reaper`
    try:
        version = run_lease(store)
        held = SharedLease(store, "f1", 30.0)
        with held:
            token = held.owner["token"]
            assert held.store is not store
            assert held.store.fencing == WorkerFence(token)
            assert store.fencing == RunFence()
            assert [item.seq for item in held.store.ledger.claim("f1", held.version, 1)] == [1]
            secondary = held.store.secondary()
            try:
                assert secondary.fencing == WorkerFence(token)
                assert [item.seq for item in secondary.ledger.claim("f1", held.version, 1)] == [2]
                # Another worker finds this one dead and reaps it: its version moves on.
                joined = reaper.leases.join_run(
                    "f1", {**_NOBODY, "token": "reaper"}, 30, holder_alive
                )
                adopted = reaper.leases.adopt_orphans(
                    "f1", "reaper", joined, lambda owner, at: owner["token"] != token
                ).seqs
                assert adopted == [1, 2]
                for fenced in (held.store, secondary):
                    with pytest.raises(LeaseLost):
                        fenced.ledger.claim("f1", held.version, 1)
            finally:
                secondary.close()
            with pytest.raises(LeaseLost):
                store.ledger.claim("f1", held.version, 1)
            assert [item.seq for item in store.ledger.claim("f1", version, 1)] == [3]
        assert store.fencing == RunFence()
    finally:
        reaper.close()
        store.close()
    assert [(i.seq, i.state, i.worker_id) for i in ws.ledger.items()] == [
        (1, "in_flight", "reaper"),
        (2, "in_flight", "reaper"),
        (3, "in_flight", None),
        (4, "pending", None),
    ]


SLOW_S = 1.5  # how long the receiver takes over each request
# How late after the takeover a request may still start: the committer's next look (every
# 0.2 s at most) and what a loaded machine adds to it; a request started by a sender the
# committer did not stop comes only as one of the earlier requests ends, SLOW_S after.
LOOK_S = 0.6


@pytest.mark.both_stores
@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 8])
def test_a_lease_taken_over_under_a_live_sender_stops_its_sends_at_its_next_look(
    ws: Workspace, n: int
) -> None:
    """A `send` (N = 1, or 8 with items claimed ahead) behind a slow receiver: its lease's
    version is moved under it (the run's on SQLite, its own worker lease's on PostgreSQL)
    while its heartbeat (every 10 s) still thinks it fresh. No request starts more than
    LOOK_S later (the committer's flag read, not a renewal, finds it), and it exits 4
    saying another process took over."""
    receiver = Receiver(commit_delay_s=SLOW_S)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 30\n\n"
            + webhook_config(receiver, idempotent=False, status=True, timeout=10 * SLOW_S)
        )
        ws.write_csv("batch.csv", make_rows(100))
        taken: list[float] = []

        def take_over() -> None:
            # A second round of requests has started (at N = 8 from the items claimed
            # ahead): the next one starts as soon as one of these ends.
            receiver.wait_for(lambda r: len(r.arrivals) >= n + 1)
            if ws.url:
                ws.forge.worker_leases_taken_over()
            else:
                ws.forge.run_lease_taken_over()
            taken.append(time.time())

        # The send in-process, the takeover forged from a thread while it runs.
        with meanwhile(take_over):
            sender = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
    out = sender.output
    assert taken, out
    assert sender.exit_code == 4, out
    assert "another process took over this run" in out, out
    late = [a.wall - taken[0] for a in receiver.arrivals if a.wall > taken[0] + LOOK_S]
    assert late == [], f"requests started {late} s after the takeover"


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_loss_the_committer_finds_is_marked_before_any_queued_item_starts(
    ws: Workspace,
) -> None:
    """N = 8 senders each hold a request, 24 more items claimed ahead wait in their queue;
    the run's lease version moves. The committer's look finds it and, before anything
    else, marks the lease lost with its cause (the senders' and the heartbeat's flag):
    nothing queued starts once the held requests end, and the run ends in LeaseLost."""
    store = Store.open(ws.db, create=True)
    store.plans.create_run(
        {"run_id": "f1", "state": "planned", "created_at": clock.now_iso(), "batch_path": "b",
         "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
         "contract_version": "v1"},
        [{"run_id": "f1", "seq": i, "item_id": str(i), "channel": "hooks",
          "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
          "intent_digest": f"sha256:{i}"} for i in range(1, 41)],
    )  # fmt: skip
    try:
        version = store.leases.acquire_lease("f1", _NOBODY, 30, lambda owner, at: False)
        channel = Holding()
        lost = RunControl()
        runner = Runner(
            store, store.core.get_run("f1"),
            {"hooks": channel}, RetryPolicy(), RunOptions(concurrency=8),
            lease_version=version, control=lost,
            say=lambda line: None,
        )  # fmt: skip
        ended: list[BaseException] = []

        def run() -> None:
            try:
                runner.run()
            except LeaseLost as exc:
                ended.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_for(lambda: len(channel.started) == 8, "8 requests held", timeout=20)
            ws.forge.run_lease_taken_over()
            wait_for(lambda: lost.lost, "the loss marked while the held requests are under way", 20)
            assert lost.loss is LossCause.TAKEN_OVER
        finally:
            channel.release.set()
            thread.join(WAIT_S)
        assert len(ended) == 1 and isinstance(ended[0], LeaseLost), ended
        assert len(channel.started) == 8, channel.started
    finally:
        store.close()


def _expired_worker_holding_two(ws: Workspace) -> tuple[Store, int]:
    """Worker A (on another host, so judged by its lease's expiry) joined run f1 with a
    0.3 s lease and claimed items 1 and 2; its lease has expired (frozen, or its heartbeat
    starved). Returns A's store and version."""
    planned(ws, 4)
    a = Store.open(ws.db).for_worker("worker-a")
    owner = {**_NOBODY, "token": "worker-a"}
    version = a.leases.join_run("f1", owner, 0.3, holder_alive)
    assert [item.seq for item in a.ledger.claim("f1", version, 2)] == [1, 2]
    (lease,) = a.leases.live_workers("f1")
    wait_for(lambda: clock.parse(lease.expires_at) < clock.now(), "A's lease expired", 10)
    return a, version


def _renewed_once_found_dead(a: Store, version: int, renewals: list[bool]) -> Callable[..., bool]:
    """holder_alive for the taker, with A's renewal landing right after A is found dead:
    between the taker's read of A's lease and its fence (A thawed at that moment)."""

    def alive(owner: dict[str, Any], expires_at: str | None) -> bool:
        verdict = holder_alive(owner, expires_at)
        if owner.get("token") == "worker-a" and not verdict and not renewals:
            renewals.append(a.leases.renew_worker("worker-a", version, 30))
        return verdict

    return alive


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_worker_whose_renewal_landed_after_it_was_found_dead_is_not_reaped(
    ws: Workspace,
) -> None:
    """A renewal that succeeded is never overruled by a reap decided on the lease read
    before it: A keeps its items and its lease (its senders were told the lease is good),
    and the other worker adopts nothing; once A's lease expires again unrenewed, it is."""
    a, a_version = _expired_worker_holding_two(ws)
    b = Store.open(ws.db).for_worker("worker-b")
    try:
        b_version = b.leases.join_run("f1", {**_NOBODY, "token": "worker-b"}, 30, holder_alive)
        renewals: list[bool] = []
        alive = _renewed_once_found_dead(a, a_version, renewals)
        adopted = b.leases.adopt_orphans("f1", "worker-b", b_version, alive).seqs
        assert renewals == [True]
        assert adopted == []
        assert [item.seq for item in a.ledger.claim("f1", a_version, 1)] == [3]
    finally:
        a.close()
        b.close()


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_worker_whose_renewal_landed_after_it_was_found_dead_keeps_the_run_from_a_taker(
    ws: Workspace,
) -> None:
    """The same moment for `cancel` or `reconcile`, which take the run's own lease: A's
    renewal landed after A was found dead, so the run is held (LeaseHeld), not taken.
    On SQLite a renewal cannot land inside the taker's write transaction (the file's write
    lock orders them), so there the race is PostgreSQL's."""
    if not ws.url:
        pytest.skip("PostgreSQL: on SQLite the taker's write lock keeps A's renewal out")
    a, a_version = _expired_worker_holding_two(ws)
    taker = Store.open(ws.db)
    try:
        renewals: list[bool] = []
        alive = _renewed_once_found_dead(a, a_version, renewals)
        with pytest.raises(LeaseHeld):
            taker.leases.acquire_lease("f1", _NOBODY, 30, alive)
        assert renewals == [True]
        assert [item.seq for item in a.ledger.claim("f1", a_version, 1)] == [3]
    finally:
        a.close()
        taker.close()
