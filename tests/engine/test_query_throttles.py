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
import tenacity

from notifier.channels import Ready, always
from notifier.channels.webhook import WebhookChannel
from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.decide import Finding
from notifier.domain.intent import Intent
from notifier.domain.records import Item
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import ItemState
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.runner import Runner, RunOptions
from notifier.engine.settle_by_query import GATE_WAIT_S, Asking
from notifier.store import Store

from ..conftest import Workspace, wait_for
from ..receiver import WAIT_S

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
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
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
        store, store.core.get_run("q1"),
        {"hooks": channel}, RetryPolicy.from_settings(5, 60, 0.01, 0.05),
        RunOptions(concurrency=n), lease_version=version, control=RunControl(),
        say=lambda line: None,
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


@dataclass
class _QueriedOnly:
    """A downstream asked about items only: its first query is answered 429 with
    `retry_after`, every later one finds nothing. Notes when each query started."""

    retry_after: float
    name: str = "hooks"
    idempotent: bool = False
    queryable: bool = True
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    asked: list[float] = field(default_factory=list)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        raise AssertionError("a settling pass sends nothing")

    def query(self, key: str) -> Receipt | None:
        self.asked.append(time.monotonic())
        if len(self.asked) == 1:
            raise ChannelError(ErrorKind.THROTTLED, "HTTP 429", retry_after=self.retry_after)
        return None

    def close(self) -> None:
        pass


def _in_flight(seq: int) -> Item:
    return Item(
        run_id="r", seq=seq, item_id=str(seq), channel="hooks", target="a@b.c", payload={},
        idempotency_key=f"k{seq}", intent_digest="sha256:x", state=ItemState.IN_FLIGHT,
        attempts=1, next_attempt_at=None, receipt_id=None, last_error=None,
    )  # fmt: skip


def test_a_settling_pass_waits_out_a_short_throttle_and_leaves_a_long_one_unasked() -> None:
    """Outside the runner (resume's settling, cancel, reconcile): a query answered 429 is
    not tried again, and closes its channel; the next item of that channel is asked only
    once Retry-After has passed (a short one is waited out), and an item of a channel
    closed for longer than the pass may wait is not asked at all."""
    channel = _QueriedOnly(retry_after=0.4)
    asking = Asking()
    first = asking.ask(channel, _in_flight(1), tenacity.wait_none())
    assert first is not None and first.throttled is not None, first
    assert len(channel.asked) == 1, "a throttled query is never tried again at once"
    second = asking.ask(channel, _in_flight(2), tenacity.wait_none())
    assert second is not None and second.finding is Finding.NOT_FOUND, second
    assert channel.asked[1] - channel.asked[0] >= 0.4
    asking.gates.gate("hooks", time.monotonic() + 2 * GATE_WAIT_S)
    third = asking.ask(channel, _in_flight(3), tenacity.wait_none())
    assert third is not None and third.finding is Finding.UNCERTAIN, third
    assert len(channel.asked) == 2, "a channel closed for long is not asked"
