"""The Runner is handed the run as it was read once its lease was held (app/working.py):
nothing between its construction and its first request reads the run's row again (its state
decides the start, its channel snapshot the domain rates, its approval the expiry). A spy on
the store counts the reads, on both stores, at N = 1 and N = 8."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from notifier.channels import Ready, always
from notifier.domain import clock
from notifier.domain.answers import Receipt
from notifier.domain.intent import Intent
from notifier.domain.records import Run
from notifier.domain.retry import RetryPolicy
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.runner import Runner, RunOptions
from notifier.store import Store

from ..conftest import Workspace

WAIT_S = 30.0


@dataclass
class _Counting:
    """Accepts every request, noting how many run reads the spy had counted at the first."""

    reads: Callable[[], int]
    name: str = "hooks"
    idempotent: bool = True
    queryable: bool = True
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    at_first_send: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        with self.lock:
            if not self.at_first_send:
                self.at_first_send.append(self.reads())
        return Receipt("r-" + intent.item_id, intent.intent_digest)

    def query(self, key: str) -> Receipt | None:
        return None

    def close(self) -> None:
        pass


@pytest.mark.both_stores
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.timeout(60)
def test_the_runner_reads_no_run_row_before_its_first_send(ws: Workspace, n: int) -> None:
    store = Store.open(ws.db, create=True)
    try:
        store.plans.create_run(
            {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(),
             "batch_path": "b", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
             "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
             "contract_version": "v1"},
            [{"run_id": "r1", "seq": i, "item_id": str(i), "channel": "hooks",
              "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
              "intent_digest": f"sha256:{i}"} for i in range(1, 2 * n + 1)],
        )  # fmt: skip
        version = store.leases.acquire_lease(
            "r1", {"host": "h", "pid": os.getpid()}, 30, holder_alive
        )
        run = store.core.get_run("r1")  # as the caller reads it, once the lease is held
        reads: list[str] = []
        get_run = store.core.get_run

        def counted(run_id: str) -> Run:
            reads.append(run_id)
            return get_run(run_id)

        store.core.get_run = counted  # type: ignore[method-assign]
        channel = _Counting(reads=lambda: len(reads))
        result = Runner(
            store, run, {"hooks": channel}, RetryPolicy(), RunOptions(concurrency=n),
            lease_version=version, control=RunControl(), say=lambda line: None,
        ).run()  # fmt: skip
        assert result.stop is Stop.COMPLETED, result
        assert channel.at_first_send == [0], (channel.at_first_send, reads)
    finally:
        store.close()
