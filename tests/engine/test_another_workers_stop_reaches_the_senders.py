"""Another worker's halt or pause of a shared PostgreSQL run reaches this worker's senders at
its committer's next look at the run (every 0.2 s at most, while anything is in flight):
from then on, none of them starts an item it took from the queue of items claimed ahead.
In process, with a second worker's store making the move as that worker would."""

from __future__ import annotations

import threading
import time

import pytest

from notifier.domain import clock
from notifier.domain.records import StopCause
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import RunState, RunTrigger
from notifier.engine.coordination import RunResult
from notifier.engine.membership import SharedLease, holder_alive
from notifier.engine.run_control import Stop
from notifier.engine.runner import Runner, RunOptions
from notifier.store import Store

from ..conftest import Workspace, wait_for
from ..receiver import WAIT_S
from ..support.held import Holding

# How long after the other worker's move this worker's senders may still start a request:
# the committer's next look (every 0.2 s at most) and what a loaded machine adds to it.
LOOK_S = 1.0
_OTHER = {"host": "elsewhere", "pid": 1, "started": None, "token": "other"}


def _planned(ws: Workspace, items: int) -> Store:
    store = Store.open(ws.db, create=True)
    store.plans.create_run(
        {"run_id": "s1", "state": "planned", "created_at": clock.now_iso(), "batch_path": "b",
         "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
         "contract_version": "v1"},
        [{"run_id": "s1", "seq": i, "item_id": str(i), "channel": "hooks",
          "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
          "intent_digest": f"sha256:{i}"} for i in range(1, items + 1)],
    )  # fmt: skip
    return store


@pytest.mark.parametrize("ws", ["postgres"], indirect=True)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("trigger", [RunTrigger.HALT, RunTrigger.PAUSE])
@pytest.mark.parametrize("n", [1, 8])
def test_another_workers_halt_or_pause_stops_this_workers_queued_items(
    ws: Workspace, n: int, trigger: RunTrigger
) -> None:
    """This worker's N senders each hold a request (at N = 8 with 3N more items claimed
    ahead, waiting in their queue); another worker halts (or pauses) the run. Within
    LOOK_S every sender knows it (the check right before a send says why not), and once
    the held requests end no queued item starts: exactly the N held ones went out, and
    this worker ends as the other's move says."""
    store = _planned(ws, 4 * n + 8)
    other = Store.open(ws.db).for_worker("other")
    try:
        channel = Holding()
        with SharedLease(store, "s1", 30.0) as lease:
            runner = Runner(
                lease.store, lease.store.core.get_run("s1"),
                {"hooks": channel}, RetryPolicy(), RunOptions(concurrency=n),
                lease_version=lease.version, control=lease.control,
                lease_valid=lease.surely_valid, say=lambda line: None,
            )  # fmt: skip
            ended: list[RunResult] = []
            thread = threading.Thread(target=lambda: ended.append(runner.run()))
            thread.start()
            try:
                wait_for(lambda: len(channel.started) == n, f"{n} requests held", WAIT_S)
                version = other.leases.join_run("s1", _OTHER, 30, holder_alive)
                cause = StopCause.HALTED if trigger is RunTrigger.HALT else StopCause.CHANNEL_DOWN
                moved = other.ledger.move_run_from(
                    "s1",
                    trigger,
                    version,
                    (RunState.RUNNING,),
                    stop_reason="by the other",
                    stop_cause=cause,
                )
                assert moved is not RunState.RUNNING
                seen = time.monotonic()
                if n > 1:  # at N = 1 the committer is its one sender, held in the request
                    wait_for(
                        lambda: runner.dispatch.may_start() is not None,
                        "this worker's senders told of the other's move",
                        5 * LOOK_S,
                    )
                    assert time.monotonic() - seen < LOOK_S
                    assert "another worker" in (runner.dispatch.may_start() or "")
            finally:
                channel.release.set()
                thread.join(WAIT_S)
        assert len(ended) == 1, "the runner did not end"
        assert ended[0].state is moved and ended[0].stop is not Stop.COMPLETED, ended[0]
        assert len(channel.started) == n, channel.started
        counts = store.queries.counts("s1")
        assert (counts.sent, counts.in_flight, counts.pending) == (n, 0, 3 * n + 8), counts
    finally:
        other.close()
        store.close()
