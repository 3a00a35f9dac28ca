"""A worker of a shared run that adopts items no live worker holds says whose they were as
it is: how many workers left them, and of those, which died (fenced out as dead) and which
exited (released their lease, leaving unknown items for another worker to settle), never
"a worker that died" for items several workers left, or one that left on its own. In
process on a real PostgreSQL server, the workers' leases made as `worker` makes them."""

from __future__ import annotations

import pytest

from notifier.domain.records import AttemptOutcome, Outcome
from notifier.domain.state_machine import ItemState, ItemTrigger
from notifier.engine.coordination import RunOptions, Shared
from notifier.engine.judging import Progress
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl
from notifier.store import Store

from ..conftest import Workspace
from ..crash.test_cancel_settles_dead_workers_items import AskedByKey, _dies, _forge
from .test_pg_concurrent_writes import pg_url, plan, worker

__all__ = ["pg_url"]


def _adopting(store: Store, run_id: str, version: int) -> tuple[list[int], list[str]]:
    """worker-a's adoption of what no live worker holds: the seqs, and what it said."""
    said: list[str] = []
    coord = Shared(
        "worker-a", store, run_id, {"outbox": AskedByKey(set())}, version,
        Progress(said.append), RunOptions(concurrency=8), RunControl(),
    )  # fmt: skip
    return [item.seq for item in coord.adopt()], said


def _leaves_unknown(store: Store, run_id: str, version: int, n: int) -> None:
    """A worker claims `n` items, loses their answers (unknown), and exits: its lease
    released, as a worker that exits 3 leaves it."""
    claimed = store.ledger.claim(run_id, version, n)
    lost = [
        Outcome(i.seq, ItemTrigger.LOSE, AttemptOutcome.UNCERTAIN, expected=ItemState.IN_FLIGHT)
        for i in claimed
    ]
    store.ledger.record(run_id, version, lost)
    worker_id = store.fencing.worker_id  # type: ignore[union-attr]
    left = store.leases.leave_unless_last(
        run_id, worker_id, version, holder_alive, wait_for_busy=False
    )
    assert left == "left"


@pytest.mark.timeout(60)
def test_items_two_dead_workers_left_are_named_as_two_workers_that_died(
    ws: Workspace, pg_url: str
) -> None:
    plan(ws, pg_url, "d2", "batch.csv", 1)
    _forge(pg_url).run_state("d2", "running")
    a, a_version = worker(pg_url, "d2", "worker-a")
    b, b_version = worker(pg_url, "d2", "worker-b")
    c, c_version = worker(pg_url, "d2", "worker-c")
    try:
        b.ledger.claim("d2", b_version, 2)  # seqs 1-2
        c.ledger.claim("d2", c_version, 1)  # seq 3
        _dies(pg_url, "worker-b")
        _dies(pg_url, "worker-c")
        seqs, said = _adopting(a, "d2", a_version)
    finally:
        for store in (a, b, c):
            store.close()
    assert seqs == [1, 2, 3]
    assert "settling 3 item(s) left by 2 workers that died" in said, said


@pytest.mark.timeout(60)
def test_items_one_dead_worker_left_are_named_as_left_by_a_worker_that_died(
    ws: Workspace, pg_url: str
) -> None:
    plan(ws, pg_url, "d1", "batch.csv", 1)
    _forge(pg_url).run_state("d1", "running")
    a, a_version = worker(pg_url, "d1", "worker-a")
    b, b_version = worker(pg_url, "d1", "worker-b")
    try:
        b.ledger.claim("d1", b_version, 2)
        _dies(pg_url, "worker-b")
        seqs, said = _adopting(a, "d1", a_version)
    finally:
        a.close()
        b.close()
    assert seqs == [1, 2]
    assert "settling 2 item(s) left by a worker that died" in said, said


@pytest.mark.timeout(60)
def test_unknown_items_a_worker_left_on_exiting_are_never_said_left_by_one_that_died(
    ws: Workspace, pg_url: str
) -> None:
    plan(ws, pg_url, "x1", "batch.csv", 1)
    _forge(pg_url).run_state("x1", "running")
    a, a_version = worker(pg_url, "x1", "worker-a")
    b, b_version = worker(pg_url, "x1", "worker-b")
    try:
        _leaves_unknown(b, "x1", b_version, 2)  # seqs 1-2, unknown; worker-b exited
        seqs, said = _adopting(a, "x1", a_version)
    finally:
        a.close()
        b.close()
    assert seqs == [1, 2]
    assert "settling 2 item(s) left by a worker that exited" in said, said
    assert not any("died" in line for line in said), said


@pytest.mark.timeout(60)
def test_items_left_by_a_worker_that_exited_and_one_that_died_name_both(
    ws: Workspace, pg_url: str
) -> None:
    plan(ws, pg_url, "m1", "batch.csv", 1)
    _forge(pg_url).run_state("m1", "running")
    a, a_version = worker(pg_url, "m1", "worker-a")
    b, b_version = worker(pg_url, "m1", "worker-b")
    c, c_version = worker(pg_url, "m1", "worker-c")
    try:
        _leaves_unknown(b, "m1", b_version, 2)  # seqs 1-2, unknown; worker-b exited
        c.ledger.claim("m1", c_version, 1)  # seq 3, in flight; worker-c dies
        _dies(pg_url, "worker-c")
        seqs, said = _adopting(a, "m1", a_version)
    finally:
        for store in (a, b, c):
            store.close()
    assert seqs == [1, 2, 3]
    assert "settling 3 item(s) left by 2 workers: one that died, one that exited" in said, said
