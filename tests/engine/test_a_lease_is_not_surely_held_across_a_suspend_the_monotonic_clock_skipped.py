"""A worker's sends are guarded by `Lease.surely_valid`: the lease was renewed less than two
thirds of its TTL ago. That age was read on the monotonic clock alone, and on Linux
CLOCK_MONOTONIC (Python's time.monotonic) does not count the time the system was suspended
(a laptop's lid, a VM suspended to disk or paused by its hypervisor, `systemctl suspend`):
CLOCK_BOOTTIME does, as the wall clock does. A worker whose machine slept for longer than
the TTL woke with its lease looking freshly renewed, while another process, by its wall
clock, had found it expired and taken the run over: the sleeper's senders then started the
items it had claimed ahead, which the new holder settles by query and sends again (a
non-idempotent receiver gets them twice).

In process, both stores, N = 8 with 3N claimed ahead: the first answer holds the committer
(so it makes no look at the run that would find the takeover); then the machine "sleeps"
for twice the TTL (the boot-time clock and the wall clock move on, the monotonic clock
does not; the heartbeat, asleep too, renews nothing yet), another process takes the run,
and the next answer frees a sender, which must not start a queued item."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from notifier.domain import clock
from notifier.domain.retry import RetryPolicy
from notifier.engine import membership
from notifier.engine.judging import SendResult
from notifier.engine.runner import Runner, RunOptions
from notifier.store import LeaseLost, Store
from notifier.store.leases import Leases

from ..conftest import Workspace, wait_for
from ..support.held import WAIT_S, Answered, CommitterHeld

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]

TTL_S = 30.0  # real seconds: the heartbeat's first beat (TTL / 3) comes long after the test
N = 8


class _Suspendable:
    """The lease module's clocks, with a suspend the monotonic clock does not count: the
    boot-time clock moves on by what the machine slept (as Linux reports it)."""

    def __init__(self) -> None:
        self.slept = 0.0

    def clock_gettime(self, which: int) -> float:
        now = time.clock_gettime(which)
        return now + self.slept if which == time.CLOCK_BOOTTIME else now

    def namespace(self) -> SimpleNamespace:
        return SimpleNamespace(
            monotonic=time.monotonic,
            clock_gettime=self.clock_gettime,
            CLOCK_BOOTTIME=time.CLOCK_BOOTTIME,
            CLOCK_MONOTONIC=time.CLOCK_MONOTONIC,
        )


def _plan(db: str | Any, items: int) -> Store:
    store = Store.open(db, create=True)
    store.plans.create_run(
        {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(),
         "batch_path": "b", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
         "contract_version": "v1"},
        [{"run_id": "r1", "seq": i, "item_id": str(i), "channel": "hooks",
          "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
          "intent_digest": f"sha256:{i}"} for i in range(1, items + 1)],
    )  # fmt: skip
    return store


def test_no_queued_item_starts_after_a_suspend_longer_than_the_ttl_and_a_takeover(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    clocks = _Suspendable()
    monkeypatch.setattr(membership, "time", clocks.namespace())
    renewing = threading.Event()  # the heartbeat, asleep with the machine: renews nothing

    def asleep(*args: Any, **kwargs: Any) -> bool:
        renewing.wait(WAIT_S)
        return True

    monkeypatch.setattr(Leases, "renew_lease", asleep)
    channel = Answered(idempotent=False)  # queryable: 3N are claimed ahead
    store = _plan(ws.db, 4 * N)
    lease = membership.SoleLease(store, "r1", TTL_S)
    held = CommitterHeld()
    runner = Runner(
        store, store.core.get_run("r1"), {"hooks": channel},
        RetryPolicy.from_settings(5, 60, 0.01, 0.05), RunOptions(concurrency=N),
        lease_version=lease.version, control=lease.control, crash=held,
        lease_valid=lease.surely_valid, say=lambda line: None,
    )  # fmt: skip
    taken: list[object] = []  # each job a sender finished, in order
    changed = threading.Condition()
    send_one = runner._senders._send

    def counted(job: Any) -> Any:
        slot = send_one(job)
        with changed:
            taken.append(slot.result if isinstance(slot, SendResult) else slot)
            changed.notify_all()
        return slot

    runner._senders._send = counted
    ended: list[BaseException | object] = []

    def run() -> None:
        try:
            ended.append(runner.run())
        except BaseException as exc:  # LeaseLost, as it should end
            ended.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    taker = Store.open(ws.db)
    try:
        channel.wait_started(N)
        channel.let_go("1")  # its sender goes on to item N + 1, before any sleep
        assert held.reached.wait(WAIT_S), "the committer never took up the first answer"
        channel.wait_started(N + 1)

        # The machine sleeps for twice the TTL: the boot-time and wall clocks move on, the
        # monotonic clock does not.
        clocks.slept = 2 * TTL_S
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(seconds=2 * TTL_S))
        # Meanwhile another process found the lease expired (by its wall clock) and took the
        # run over: it settles the items in flight by query and sends them again.
        taker.leases.acquire_lease(
            "r1",
            {"host": "elsewhere", "pid": os.getpid() + 1, "token": "taker"},
            TTL_S,
            lambda owner, expires_at: (
                expires_at is not None and clock.parse(expires_at) > clock.now()
            ),
        )

        # Awake: the next answer frees a sender, which must not start a queued item.
        started_before = [item for item, _ in channel.started]
        channel.let_go("2")
        wait_for(
            lambda: len(taken) >= 3 or len(channel.started) > len(started_before),
            "the freed sender took up its next item",
            timeout=WAIT_S,
        )
        started_after = [item for item, _ in channel.started][len(started_before) :]
        assert started_after == [], (
            f"item(s) {started_after} started after the machine slept past the lease's TTL "
            "and another process took the run over"
        )
        assert not lease.surely_valid()
    finally:
        channel.let_all_go()
        held.go.set()
        renewing.set()
        thread.join(WAIT_S)
        lease.release()
        taker.close()
        store.close()
    assert ended and isinstance(ended[0], LeaseLost), ended
