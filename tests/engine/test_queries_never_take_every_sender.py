"""Status queries never hold every sender: at most max(1, N // 2) queries are under way at
once (a sender's after an uncertain answer, and the committer's questions, which have
threads of their own), so while a status endpoint holds its answers the other senders go
on sending. An uncertain answer that finds every query slot taken leaves its item unknown,
to be asked about once a slot is free; nothing is sent twice."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from notifier.channels import Ready, always
from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent
from notifier.domain.retry import RetryPolicy
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.runner import Runner, RunOptions
from notifier.store import Store

from ..conftest import Workspace, wait_for
from ..receiver import WAIT_S


@dataclass
class _HoldsItsQueries:
    """A downstream that cannot dedupe and can be asked: the first request of each of the
    items in `uncertain` answers as a 502 would, every other request is accepted at once,
    and every status query is held until `release` (then: nothing found). Counts the
    queries under way at once, and the requests accepted."""

    uncertain: set[str]
    name: str = "hooks"
    idempotent: bool = False
    queryable: bool = True
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    accepted: list[str] = field(default_factory=list)
    sends: list[str] = field(default_factory=list)
    asking: int = 0
    most_asking: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        with self.lock:
            first = intent.item_id not in self.sends
            self.sends.append(intent.item_id)
            if not (first and intent.item_id in self.uncertain):
                self.accepted.append(intent.item_id)
                return Receipt("r-" + intent.item_id, intent.intent_digest)
        raise ChannelError(ErrorKind.UNCERTAIN, "HTTP 502", http_status=502)

    def query(self, key: str) -> Receipt | None:
        with self.lock:
            self.asking += 1
            self.most_asking = max(self.most_asking, self.asking)
        try:
            self.release.wait(WAIT_S)
            return None
        finally:
            with self.lock:
                self.asking -= 1

    def close(self) -> None:
        pass


def _planned(ws: Workspace, items: int) -> Store:
    store = Store.open(ws.db, create=True)
    store.plans.create_run(
        {"run_id": "h1", "state": "planned", "created_at": clock.now_iso(), "batch_path": "b",
         "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
         "contract_version": "v1"},
        [{"run_id": "h1", "seq": i, "item_id": str(i), "channel": "hooks",
          "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
          "intent_digest": f"sha256:{i}"} for i in range(1, items + 1)],
    )  # fmt: skip
    return store


@pytest.mark.both_stores
@pytest.mark.timeout(90)
def test_held_status_queries_leave_senders_to_send(ws: Workspace) -> None:
    """N = 8: the first 8 requests (one per sender) answer uncertain, and the receiver holds
    every status query. At most 4 queries are ever under way, and while they are held the
    other 32 items are all sent; once the queries are answered (nothing found) the 8 are
    sent again, each accepted once, and the run completes. (The unknown-streak limit is set
    above 8 here: at 5, eight uncertain answers in a row rightly stop every send, whatever
    the query slots; tests/engine/test_every_concurrency.py pins that brake.)"""
    n, items = 8, 40
    store = _planned(ws, items)
    channel = _HoldsItsQueries(uncertain={str(i) for i in range(1, n + 1)})
    version = store.leases.acquire_lease("h1", {"host": "h", "pid": 1}, 30, holder_alive)
    runner = Runner(
        store, store.core.get_run("h1"),
        {"hooks": channel}, RetryPolicy.from_settings(5, 60, 0.01, 0.05),
        RunOptions(concurrency=n, unknown_streak_limit=50), lease_version=version,
        control=RunControl(), say=lambda line: None,
    )  # fmt: skip
    results = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()
    try:
        wait_for(
            lambda: len(channel.accepted) >= items - n,
            "every other item sent while the status queries are held",
            20,
        )
        assert channel.asking >= 1, "no status query was held"
        channel.release.set()
        thread.join(WAIT_S)
    finally:
        channel.release.set()
        thread.join(WAIT_S)
        counts = store.queries.counts("h1")
        store.close()
    assert channel.most_asking <= n // 2, channel.most_asking
    assert results and results[0].stop is Stop.COMPLETED, results
    assert counts.sent == items, counts
    assert sorted(channel.accepted, key=int) == [str(i) for i in range(1, items + 1)]
