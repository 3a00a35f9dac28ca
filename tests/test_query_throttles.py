"""A 429 (or 503) answer to a status query is the channel's answer, as a send's 429 is: it
closes the channel's gate for its Retry-After, and neither a send nor a query of that
channel starts before it opens. The webhook reads it as a throttle; the runner honours it
at N = 1 and 8, on both stores."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx2
import pytest

from notifier import clock
from notifier.channels import ChannelError, ErrorKind, Ready, Receipt, always
from notifier.channels.webhook import WebhookChannel
from notifier.intent import Intent
from notifier.judging import Stop
from notifier.lease import LostFlag, holder_alive
from notifier.retry import RetryPolicy
from notifier.runner import Runner, RunOptions
from notifier.signals import Interruption
from notifier.store import Store

from .conftest import Workspace, wait_for
from .receiver import WAIT_S

RETRY_AFTER_S = 1.0


@pytest.mark.parametrize("status", [429, 503])
def test_a_throttled_status_query_is_read_as_a_throttle_with_its_retry_after(
    status: int,
) -> None:
    """GET status_url answered 429 (or 503) with Retry-After: THROTTLED, with the wait the
    receiver asked for, never a plain uncertain answer (which would be asked again at once)."""
    transport = httpx2.MockTransport(
        lambda request: httpx2.Response(status, headers={"Retry-After": "7"})
    )
    hooks = WebhookChannel(
        "hooks",
        {"type": "webhook", "url": "http://hooks.test/n", "status_url": "http://hooks.test/{key}"},
        transport,
    )
    with pytest.raises(ChannelError) as caught:
        hooks.query("k1")
    assert caught.value.kind is ErrorKind.THROTTLED
    assert (caught.value.http_status, caught.value.retry_after) == (status, 7.0)


@dataclass
class _ThrottlesItsQuery:
    """A downstream that cannot dedupe and can be asked. Item 1's first request answers as
    a 502 would (uncertain), and the status query that follows is answered 429 with
    Retry-After; every later query finds nothing. Every other request waits for `release`.
    Notes when each request and each query started (monotonic)."""

    name: str = "hooks"
    idempotent: bool = False
    queryable: bool = True
    thread_safe: bool = True
    release: threading.Event = field(default_factory=threading.Event)
    starts: list[tuple[str, str, float]] = field(default_factory=list)
    throttled_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        with self.lock:
            first = not any(what == "send" and i == "1" for what, i, _ in self.starts)
            self.starts.append(("send", intent.item_id, time.monotonic()))
        if intent.item_id == "1" and first:
            raise ChannelError(ErrorKind.UNCERTAIN, "HTTP 502", http_status=502)
        self.release.wait(WAIT_S)
        return Receipt("r-" + intent.item_id, intent.intent_digest)

    def query(self, key: str) -> Receipt | None:
        with self.lock:
            self.starts.append(("query", key, time.monotonic()))
            first = not self.throttled_at
            if first:
                self.throttled_at = time.monotonic()
        if first:
            raise ChannelError(
                ErrorKind.THROTTLED, "HTTP 429", http_status=429, retry_after=RETRY_AFTER_S
            )
        return None

    def close(self) -> None:
        pass


def _planned(ws: Workspace, items: int) -> Store:
    store = Store.open(ws.db, create=True)
    store.plans.create_run(
        {"run_id": "q1", "state": "planned", "created_at": clock.now_iso(), "batch_path": "b",
         "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
         "contract_version": "v1"},
        [{"run_id": "q1", "seq": i, "item_id": str(i), "channel": "hooks",
          "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
          "intent_digest": f"sha256:{i}"} for i in range(1, items + 1)],
    )  # fmt: skip
    return store


@pytest.mark.both_stores
@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 8])
def test_a_throttled_status_query_holds_back_every_send_and_query_until_retry_after(
    ws: Workspace, n: int
) -> None:
    """Item 1's uncertain answer is followed by a status query, answered 429 with
    Retry-After. From that answer until Retry-After has passed no request and no query of
    the channel starts (at N = 8 the other senders, held until the 429 came, then free up
    and find items claimed ahead waiting); then item 1 is asked again, found undelivered,
    sent again, and the run completes with every item sent."""
    store = _planned(ws, 4 * n + 4)
    channel = _ThrottlesItsQuery()
    if n == 1:
        channel.release.set()
    version = store.leases.acquire_lease("q1", {"host": "h", "pid": 1}, 30, holder_alive)
    runner = Runner(
        store, "q1", {"hooks": channel}, RetryPolicy.from_settings(5, 60, 0.01, 0.05),
        RunOptions(concurrency=n), lease_version=version, lease_lost=LostFlag(),
        interrupted=Interruption(), say=lambda line: None,
    )  # fmt: skip
    results = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()
    try:
        wait_for(lambda: channel.throttled_at > 0, "item 1's status query answered 429", WAIT_S)
        channel.release.set()
        thread.join(WAIT_S)
    finally:
        channel.release.set()
        thread.join(WAIT_S)
        counts = store.queries.counts("q1")
        store.close()
    assert results and results[0].stop is Stop.COMPLETED, results
    assert counts.sent == 4 * n + 4, counts
    throttled = channel.throttled_at
    early = [
        (what, item, round(at - throttled, 3))
        for what, item, at in channel.starts
        if throttled < at < throttled + RETRY_AFTER_S
    ]
    assert early == [], "requests or queries started within Retry-After of the query's 429"
    asked_again = [at for what, _, at in channel.starts if what == "query" and at > throttled]
    assert asked_again, "item 1 was never asked about again"
