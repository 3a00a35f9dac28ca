"""Settling items whose outcome is not known, by asking the downstream by key.

Used by `resume` (before any new item starts), by `cancel` (a worker's or its own when no
worker is alive), by a worker settling what dead workers left before it starts, and by
`reconcile`. Mid-run, the committer only reads what a question rests on (`question`) and
records what the answer means (`decided`); a sender asks (sending.py), right after an
uncertain answer, or for the runner's revisit of an item that waited for its query_delay and
a dead worker's items adopted mid-run. What a finding means is decided in one place,
decide.decide.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

import tenacity

from notifier.channels import Channel
from notifier.domain import clock, waits
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.decide import Answer, Caps, Finding, History, Moment, Settling, decide
from notifier.domain.decide import not_found_counts_from as counts_from
from notifier.domain.records import Attempt, Item, Outcome, PendingKind
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import FINISHED_RUN_STATES, ItemState
from notifier.store import Store

__all__ = [
    "Answer",
    "Asking",
    "Finding",
    "Question",
    "Settlement",
    "ask",
    "decided",
    "question",
    "settle",
    "settle_doubts",
    "settle_items",
    "settle_left",
]

# A query is read-only, so it may be retried freely; but it must not hold up a resume for
# long, so a few quick tries and then the item is reported as undecided.
QUERY_ATTEMPTS = 3
QUERY_WAIT = tenacity.wait_exponential(multiplier=0.2, max=2)


class _Stopped(Exception):
    """A further try of a query not made: go_on() said no during the wait before it."""


class _stop_unless(tenacity.stop.stop_base):
    """Stop retrying once `go_on()` says no."""

    def __init__(self, go_on: Callable[[], bool]) -> None:
        self.go_on = go_on

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return not self.go_on()


def ask(
    channel: Channel,
    item: Item,
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    go_on: Callable[[], bool] = lambda: True,
) -> Answer:
    """Query `channel` for `item`'s key and compare what it holds with the item's digest.
    `go_on()` is asked before each further try: a sender's query stops retrying once the
    run is stopping (the try under way is not cut short: a query is not a send)."""
    retrying = tenacity.Retrying(
        # Never a throttle: the channel asked to be left alone for its Retry-After, and the
        # caller closes its gate (no query nor send of it starts until then).
        retry=tenacity.retry_if_exception(
            lambda e: (
                isinstance(e, ChannelError) and e.kind in (ErrorKind.UNCERTAIN, ErrorKind.NOT_SENT)
            )
        ),
        stop=tenacity.stop_after_attempt(QUERY_ATTEMPTS) | _stop_unless(go_on),
        wait=lambda state: waits.scaled(wait(state)),  # the test switch (waits.py)
        reraise=True,
    )
    tries = 0
    asked_at: datetime | None = None  # when the last try left: the receiver looked after it

    def query(key: str) -> Receipt | None:
        # go_on() again right before each further try: the stop above is checked before
        # the wait between tries, and a stop that comes during that wait must not be
        # followed by one more request.
        nonlocal tries, asked_at
        tries += 1
        if tries > 1 and not go_on():
            raise _Stopped
        asked_at = clock.now()
        return channel.query(key)

    try:
        receipt = retrying(query, item.idempotency_key)
    except _Stopped:
        return Answer(Finding.UNCERTAIN, detail="query not tried again: the run is stopping")
    except ChannelError as exc:
        if exc.kind is ErrorKind.THROTTLED:
            return Answer(Finding.UNCERTAIN, detail=f"query throttled: {exc}", throttled=exc)
        return Answer(Finding.UNCERTAIN, detail=f"query failed: {exc}")
    if receipt is None:
        return Answer(
            Finding.NOT_FOUND,
            detail="the downstream holds nothing under this key",
            asked_at=asked_at,
        )
    if receipt.intent_digest is not None and receipt.intent_digest != item.intent_digest:
        return Answer(
            Finding.CONFLICT,
            receipt,
            f"the downstream holds another intent under this key ({receipt.intent_digest})",
        )
    return Answer(Finding.FOUND, receipt, "receipt found by query")


class Gates(Protocol):
    """The channels' 429/503 gates, on the monotonic clock (judging.Progress keeps the
    runner's)."""

    def gate(self, channel: str, until: float) -> None: ...

    def closed_gates(self, now: float) -> dict[str, float]: ...


class _OwnGates:
    """The gates of a settling pass that has no runner around it (`cancel`, `reconcile`)."""

    def __init__(self) -> None:
        self.gates: dict[str, float] = {}

    def gate(self, channel: str, until: float) -> None:
        self.gates[channel] = max(until, self.gates.get(channel, until))

    def closed_gates(self, now: float) -> dict[str, float]:
        return {channel: until for channel, until in self.gates.items() if until > now}


# How long one settling pass (a resume's, a cancel's) waits in all for closed gates before it
# asks: a short Retry-After is waited out, a long one leaves the channel's items unasked.
GATE_WAIT_S = 30.0
# How many throttled answers of its own one question of the runner's waits out (each for its
# Retry-After, at least the backoff) before its item is left unknown, asked about by the next
# settling pass: a status endpoint that throttles every query cannot hold a run open for ever.
THROTTLED_ASKS = 3


@dataclass
class Asking:
    """What a settling pass shares with the process around it: the channels' gates (a
    throttled query closes its channel, and no query of a closed channel starts), and who
    is told of each settlement recorded (the runner's observer: the JSON `outcome` event)."""

    gates: Gates = field(default_factory=_OwnGates)
    told: Callable[[Item, Outcome], None] = lambda item, outcome: None
    gate_wait_s: float = GATE_WAIT_S  # what is left of the pass's wait for gates

    def ask(self, channel: Channel, item: Item, wait: tenacity.wait.wait_base) -> Answer | None:
        """`ask`, unless the channel cannot be queried (None) or its gate stays closed for
        longer than the pass may still wait; a throttled answer closes the gate for its
        Retry-After (at least the backoff)."""
        if not channel.queryable:
            return None
        closed = self.gates.closed_gates(time.monotonic()).get(item.channel)
        if closed is not None:
            left = closed - time.monotonic()
            if left > self.gate_wait_s:
                return Answer(Finding.UNCERTAIN, detail="not asked: the channel is throttled")
            self.gate_wait_s -= max(0.0, left)
            time.sleep(max(0.0, left))
        answer = ask(channel, item, wait)
        if answer.throttled is not None:
            wait_s = RetryPolicy().backoff(answer.throttled, 1)
            self.gates.gate(item.channel, time.monotonic() + wait_s)
        return answer


def query_delay(channel: Channel) -> float:
    """How long after an uncertain attempt's request could have ended (its start plus the
    timeout) a 404 from `channel` still proves nothing: decide.Caps."""
    return Caps.of(channel).query_delay_s


def not_found_counts_from(channel: Channel, attempts: Sequence[Attempt]) -> datetime | None:
    """decide.not_found_counts_from for `channel` and an item's `attempts`, now."""
    return counts_from(Caps.of(channel), attempts, clock.now())


@dataclass(frozen=True)
class Settlement:
    item: Item
    outcome: Outcome | None  # None: nothing could be established, nothing changed
    line: str


@dataclass(frozen=True)
class Question:
    """An item to settle by asking its channel, with what the decision rests on, read at
    the question where the store is: its attempts and from when a 404 counts. With the
    runner's retry `policy`: its revisit of an item that waited for its query_delay."""

    item: Item
    moment: Moment
    history: History
    not_found_from: datetime | None
    policy: RetryPolicy | None = None
    # Its run is completed or cancelled, or being cancelled (Settling.run_finished).
    run_finished: bool = False

    @property
    def seq(self) -> int:
        return self.item.seq

    @property
    def channel(self) -> str:
        return self.item.channel


def question(
    store: Store, run_id: str, channel: Channel, item: Item, policy: RetryPolicy | None = None
) -> Question:
    """The question to settle `item` by (`Moment.REVISIT` with the runner's `policy`)."""
    history = History.of(store.queries.attempts(run_id, item.seq))
    moment = Moment.SETTLE if policy is None else Moment.REVISIT
    since = not_found_counts_from(channel, history.attempts)
    # The runner's revisit is of its own running run: no read of the run for it. A run a
    # cancel was asked for sends nothing more either: it is being closed (settle_left).
    run = None if policy is not None else store.core.get_run(run_id)
    finished = run is not None and (
        run.state in FINISHED_RUN_STATES or run.cancel_requested_at is not None
    )
    return Question(item, moment, history, since, policy, run_finished=finished)


def decided(q: Question, channel: Channel, answer: Answer | None, now: datetime) -> Settlement:
    """What `answer` (None: the channel cannot be queried), come at `now`, means for the
    item asked about (decide.decide)."""
    decision = decide(
        q.item,
        Settling(q.moment, answer, q.not_found_from, run_finished=q.run_finished),
        caps=Caps.of(channel),
        policy=q.policy or RetryPolicy(),
        history=q.history,
        now=now,
    )
    return Settlement(q.item, decision.outcome, decision.line)


def settle_item(
    item: Item,
    channel: Channel,
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    not_found_from: datetime | None = None,
    *,
    moment: Moment = Moment.SETTLE,
    history: History | None = None,
    asking: Asking | None = None,
) -> Settlement:
    """Ask about an `in_flight` (crashed mid-attempt) or `unknown` item, or at cancel a
    maybe-delivered pending one, and decide what it is (decide.decide). Before
    `not_found_from` (see not_found_counts_from) a 404 proves nothing."""
    answer = (asking or Asking()).ask(channel, item, wait)
    q = Question(item, moment, history or History(), not_found_from)
    return decided(q, channel, answer, clock.now())


def settle(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    *,
    include_unknown: bool,
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    asking: Asking | None = None,
) -> list[Settlement]:
    """Settle every in-flight item (and, with `include_unknown`, every unknown item whose
    channel can be queried), each recorded before the next is asked about."""
    states = [ItemState.IN_FLIGHT, ItemState.UNKNOWN] if include_unknown else [ItemState.IN_FLIGHT]
    items = list(store.queries.items(run_id, states))
    return settle_items(store, run_id, channels, lease_version, items, say, wait, asking)


def settle_items(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    items: list[Item],
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    asking: Asking | None = None,
) -> list[Settlement]:
    """Settle `items` one by one, each recorded before the next is asked about."""
    asking = asking or Asking()
    settled = []
    for item in items:
        channel = channels[item.channel]
        if item.state is ItemState.UNKNOWN and not channel.queryable:
            continue
        q = question(store, run_id, channel, item)
        answer = asking.ask(channel, item, wait)
        settlement = decided(q, channel, answer, clock.now())
        if settlement.outcome is not None:
            store.ledger.record(
                run_id, lease_version, [replace(settlement.outcome, expected=item.state)]
            )
            asking.told(item, settlement.outcome)
        say(settlement.line)
        settled.append(settlement)
    return settled


def settle_left(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    items: list[Item],
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    *,
    wait_until: datetime | None = None,
    asking: Asking | None = None,
) -> list[Settlement]:
    """For closing a cancelled run over `items` dead workers left in flight (the last
    worker's, or `cancel`'s own with no worker left): each is asked about now. Then every
    item of the run a process left mid-request (its last attempt closed `interrupted`:
    these, or ones asked about earlier) that a 404
    could not settle yet, because the receiver may still commit the request until
    `not_found_counts_from`, is asked again once it counts, so a request that never left
    ends proven undelivered rather than unknown. The wait is bounded by the channel's
    timeout + query_delay, as a request still under way is, and by `wait_until` (cancel's
    --wait); what it leaves unknown `unknown_waits` says. Those left pending and maybe
    delivered (a channel that dedupes) are for settle_doubts, which the caller runs next:
    their 404 counts by then too."""
    asking = asking or Asking()
    settled = settle_items(store, run_id, channels, lease_version, items, say, wait, asking)
    left = _left_mid_request(store, run_id, channels)
    later = [since for since in left.values() if since is not None]
    if later:
        until = max(later) if wait_until is None else min(max(later), wait_until)
        time.sleep(clock.seconds_until(until))
    again = [store.queries.item(run_id, seq) for seq in left]
    unknown = [item for item in again if item.state is ItemState.UNKNOWN]
    return settled + settle_items(
        store, run_id, channels, lease_version, unknown, say, wait, asking
    )


def unknown_waits(
    store: Store, run_id: str, channels: Mapping[str, Channel]
) -> tuple[tuple[int, datetime] | None, datetime | None]:
    """What the run's unknown items wait for, for the advice a run's end or a cancel prints:
    how many a plain `reconcile` can settle by query once their window has passed, and when
    the last one's passes (None: none waits for that); and when a not-sent mark is taken for
    those no query can settle, the latest moment until which the receiver may still commit
    one of them (api/settling refuses a mark before its item's; None: taken now)."""
    by_query = [since for since in _left_mid_request(store, run_id, channels).values() if since]
    by_hand = []
    for item in store.queries.items(run_id, [ItemState.UNKNOWN]):
        channel = channels[item.channel]
        if not channel.queryable:
            since = _window_ahead(channel, store.queries.attempts(run_id, item.seq))
            by_hand += [since] if since is not None else []
    return ((len(by_query), max(by_query)) if by_query else None), max(by_hand, default=None)


def _window_ahead(channel: Channel, attempts: Sequence[Attempt]) -> datetime | None:
    """When the receiver can no longer commit a request of the item `attempts` are of, if
    that is still ahead (None: past, or no request of it may have reached the receiver)."""
    since = not_found_counts_from(channel, attempts)
    return since if since is not None and since > clock.now() else None


def _left_mid_request(
    store: Store, run_id: str, channels: Mapping[str, Channel]
) -> dict[int, datetime | None]:
    """The run's open items (unknown, or pending and maybe delivered) on a channel that can
    be asked, left mid-request by a process or waiting for their query window after an
    uncertain answer: from when their 404 counts (None: it counts now)."""
    kinds = store.queries.pending_kinds(run_id)
    maybe = [seq for seq, kind in kinds.items() if kind is PendingKind.MAYBE_DELIVERED]
    unknown = [item.seq for item in store.queries.items(run_id, [ItemState.UNKNOWN])]
    left: dict[int, datetime | None] = {}
    for seq in sorted({*maybe, *unknown}):
        channel = channels[store.queries.item(run_id, seq).channel]
        attempts = store.queries.attempts(run_id, seq)
        if not channel.queryable or not attempts:
            continue
        left[seq] = _window_ahead(channel, attempts)
    return left


def settle_doubts(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    *,
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    asking: Asking | None = None,
) -> list[Settlement]:
    """For `cancel`: every pending item whose last uncertain attempt may have been delivered
    (it was waiting to retry on a channel that dedupes) is settled by query where the channel
    can be queried, and otherwise becomes unknown: a cancelled run never reports a
    maybe-delivered item as never attempted."""
    kinds = store.queries.pending_kinds(run_id)
    doubtful = [seq for seq, kind in kinds.items() if kind is PendingKind.MAYBE_DELIVERED]
    asking = asking or Asking()
    settled = []
    for seq in doubtful:
        item = store.queries.item(run_id, seq)
        channel = channels[item.channel]
        since = not_found_counts_from(channel, store.queries.attempts(run_id, seq))
        settlement = settle_item(item, channel, wait, since, moment=Moment.CANCEL, asking=asking)
        outcome = settlement.outcome
        assert outcome is not None  # every doubt ends in a move, unknown at worst
        store.ledger.record(run_id, lease_version, [replace(outcome, expected=item.state)])
        asking.told(item, outcome)
        say(settlement.line)
        settled.append(settlement)
    return settled
