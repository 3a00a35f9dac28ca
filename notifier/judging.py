"""Judging one send result: what the answer (or the error) says about delivery, and so the
item's next state (docs/design.md section 7). Every throttled answer closes its channel's gate; a
bug while judging costs only that item's certainty, never the other outcomes of a commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from . import clock
from .channels import Channel, ChannelError, ErrorKind, Receipt
from .reconcile import Finding, ask, query_delay
from .records import Item, Outcome
from .retry import Action, RetryPolicy
from .state_machine import ItemTrigger
from .store import Store

# Attempt outcomes that prove the request never reached the downstream (or was seen and
# refused unprocessed, 429/503); any other earlier attempt may have delivered.
NEVER_REACHED = frozenset({ErrorKind.NOT_SENT.value, ErrorKind.THROTTLED.value, "not_started"})


@dataclass(frozen=True)
class NotStarted:
    """A claimed item that `Dispatch.may_start` held back: no request left for it."""

    reason: str


# What one send slot produced: an answer, an error, or no request at all.
Sent = Receipt | ChannelError | NotStarted
# A send slot's result with the moment it came (wall clock, monotonic) and the moment its
# request left (None: no request); result None: not sent, this worker could not prove it
# still held the run.
Slot = tuple[Sent | None, datetime, float, datetime | None]


class Stop(StrEnum):
    """Why a run stopped. The CLI turns this (with the counts) into the exit code and the
    advice to print; the runner itself decides neither."""

    COMPLETED = "completed"  # every item settled (some may have failed)
    UNKNOWN_LEFT = "unknown_left"  # paused: unknown items wait for a reconcile
    RATE_LIMITED = "rate_limited"  # paused: a Retry-After longer than --max-wait
    INTERRUPTED = "interrupted"  # Ctrl-C: paused cleanly
    TERMINATED = "terminated"  # SIGTERM: paused cleanly, like a first Ctrl-C
    APPROVAL_EXPIRED = "approval_expired"  # paused: no send starts without a valid approval
    CHANNEL_DOWN = "channel_down"  # paused: a channel's receiver cannot be reached
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"  # finished by someone else before we started
    HALTED = "halted"  # a safety rule: endpoint gone, too many unknowns in a row
    CONFLICT = "conflict"  # halted: the downstream holds another intent under our key
    LEFT = "left"  # a worker of a shared run left it to the other workers


@dataclass
class Progress:
    """What the send loop keeps between sends: progress, the halt it must make, and the
    channel gates and item holds it times on the monotonic clock."""

    say: Callable[[str], None]
    advance: Callable[[int], None] = lambda n: None
    unknown_streak: int = 0
    halt: tuple[Stop, str] | None = None  # (HALTED, CONFLICT or CHANNEL_DOWN, reason)
    # Per channel: requests in a row that could not reach its receiver (Brakes.note_reach).
    unreached: dict[str, int] = field(default_factory=dict)
    # In-process waits run on the monotonic clock (time.monotonic()), so a step of the wall
    # clock cannot end them early; the wall-clock next_attempt_at stored with an item is only
    # for the next process.
    gates: dict[str, float] = field(default_factory=dict)  # channel → closed until (monotonic)
    holds: dict[int, float] = field(default_factory=dict)  # item seq → not before (monotonic)

    # Told of every gate closed or lengthened: (channel, now, until), monotonic (metrics, logs).
    on_gate: Callable[[str, float, float], None] | None = None
    # Senders close gates too, the moment a throttled answer arrives (Dispatch._warn).
    _gate_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def gate(self, channel: str, until: float) -> None:
        """Close `channel` until the monotonic time `until` (a gate only ever lengthens)."""
        with self._gate_lock:
            self.gates[channel] = max(until, self.gates.get(channel, until))
        if self.on_gate is not None:
            self.on_gate(channel, time.monotonic(), until)

    def closed_gates(self, now: float) -> dict[str, float]:
        """The gates still closed at monotonic `now`, as a copy (senders may add to them)."""
        with self._gate_lock:
            return {channel: until for channel, until in self.gates.items() if until > now}


class Judge:
    """Turns send results into outcomes for one run, with its channels and retry policy."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        channels: Mapping[str, Channel],
        policy: RetryPolicy,
        progress: Progress,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.channels = channels
        self.policy = policy
        self.p = progress

    def safely(
        self,
        item: Item,
        result: Sent,
        at: datetime,
        mono: float,
        *,
        may_ask: Callable[[], bool] = lambda: True,
    ) -> Outcome:
        """`_judge`, but an unexpected exception (a query that breaks, a bug) costs only this
        item's certainty: never the window's other outcomes, never a receipt in hand."""
        try:
            return self.judge(item, result, at, mono, may_ask=may_ask)
        except Exception as exc:
            problem = f"unexpected {type(exc).__name__} while judging the answer: {exc}"
        if isinstance(result, NotStarted):
            return Outcome(item.seq, ItemTrigger.RELEASE, "not_started")
        if isinstance(result, Receipt):
            # The downstream said it holds the delivery; what broke came after that.
            return _acknowledged(item, result)
        # Judge again as an uncertain answer, by the channel's own rules (an idempotent
        # channel may retry under the same key; others query or leave it unknown).
        uncertain = ChannelError(ErrorKind.UNCERTAIN, f"{result}; {problem}")
        try:
            return self.judge(item, uncertain, at, mono, may_ask=may_ask)
        except Exception as exc:
            return Outcome(
                item.seq,
                ItemTrigger.LOSE,
                ErrorKind.UNCERTAIN.value,
                http_status=result.http_status,
                error=f"{uncertain}; unexpected {type(exc).__name__}: {exc}; "
                "may have been delivered, not sent again",
                retry_after_s=result.retry_after,
            )

    def judge(
        self,
        item: Item,
        result: Sent,
        at: datetime,
        mono: float,
        *,
        may_ask: Callable[[], bool] = lambda: True,
    ) -> Outcome:
        """Turn one send result into the item's next state (docs/design.md section 7). When
        `may_ask()` says no (the run is stopping), a maybe-delivered item is not queried
        now: each query may take the channel's timeout, three times over, while the stop
        waits."""
        if isinstance(result, NotStarted):
            # Nothing left: back to pending, its attempt closed as not started, and it counts
            # as never attempted (store.record gives the attempt back).
            return Outcome(item.seq, ItemTrigger.RELEASE, "not_started")
        if isinstance(result, Receipt):
            if result.intent_digest and result.intent_digest != item.intent_digest:
                return Outcome(
                    item.seq,
                    ItemTrigger.CONFLICT,
                    "conflict",
                    error=f"conflict: downstream answered for {result.intent_digest}",
                )
            if result.replayed and not self._may_have_reached(item):
                # Nothing of ours can have reached the downstream before this attempt, yet it
                # answers from an earlier delivery under our key: it holds the key for
                # something else (another database, a reused --run-id). Not a delivery.
                return Outcome(
                    item.seq,
                    ItemTrigger.CONFLICT,
                    "conflict",
                    error="conflict: the downstream answered as a replay of an earlier "
                    "delivery under this key, but no earlier attempt of this item can have "
                    "reached it; it holds the key for something else",
                )
            return _acknowledged(item, result)
        error = result
        if error.kind is ErrorKind.NOT_SENT and error.unreachable:
            # Nothing reached the receiver: its channel's failure, never the item's. Back to
            # pending, the attempt given back (recorded as not_sent), after a backoff; the
            # runner takes the channel as down when this keeps happening.
            wait = self.policy.backoff(error, item.attempts)
            self.p.holds[item.seq] = mono + wait
            return Outcome(
                item.seq,
                ItemTrigger.RELEASE,
                ErrorKind.NOT_SENT.value,
                error=str(error),
                next_attempt_at=clock.iso(clock.later(wait, at)),
            )
        channel = self.channels[item.channel]
        verdict = self.policy.judge(
            error,
            attempts=item.attempts,
            elapsed_s=self.elapsed(item),
            idempotent=channel.idempotent,
            queryable=channel.queryable,
        )
        # Every branch closes the attempt with what the error said.
        closed = Outcome(
            item.seq,
            ItemTrigger.LOSE,
            error.kind.value,
            http_status=error.http_status,
            error=str(error),
            retry_after_s=error.retry_after,
        )
        message = str(error)
        if verdict.pause_channel:
            # Every throttled answer closes the channel, whatever becomes of this item (and,
            # recorded with the outcome, for every other worker of a shared run).
            self.p.gate(item.channel, mono + verdict.wait_s)
            closed = replace(closed, gate_until=clock.iso(clock.later(verdict.wait_s, at)))
        if verdict.action is Action.RETRY:
            self.p.holds[item.seq] = mono + verdict.wait_s
            next_at = clock.later(verdict.wait_s, at)
            return replace(
                closed, trigger=ItemTrigger.RETRY_LATER, next_attempt_at=clock.iso(next_at)
            )
        if verdict.action in (Action.QUERY, Action.EXHAUSTED) and channel.queryable:
            return self._by_query(item, error, channel, closed, at, mono, now=may_ask())
        if verdict.action is Action.CONFLICT:
            return replace(closed, trigger=ItemTrigger.CONFLICT, error=f"conflict: {message}")
        if verdict.action is Action.GONE:
            self.p.halt = (Stop.HALTED, f"endpoint gone (item {item.seq}): {message}")
            return replace(closed, trigger=ItemTrigger.GIVE_UP)
        if verdict.action is Action.FAIL:
            return replace(_suppressing(closed, error, channel), trigger=ItemTrigger.GIVE_UP)
        if verdict.action is Action.EXHAUSTED and not self._maybe_delivered(item, error):
            return replace(
                closed,
                trigger=ItemTrigger.GIVE_UP,
                error=f"gave up after {item.attempts} attempts: {message}",
            )
        return replace(closed, error=f"{message}; may have been delivered, not sent again")

    def _by_query(
        self,
        item: Item,
        error: ChannelError,
        channel: Channel,
        closed: Outcome,
        at: datetime,
        mono: float,
        *,
        now: bool,
    ) -> Outcome:
        """A maybe-delivered item on a channel that cannot dedupe: ask before anything else
        (or, not `now`, leave it unknown, to be asked about by whoever settles the run
        next)."""
        if not now:
            return replace(
                closed,
                error=f"{error}; may have been delivered: asked about after the stop",
                next_attempt_at=clock.iso(clock.later(query_delay(channel), at)),
            )
        answer = ask(channel, item)
        message = f"{error}; {answer.detail}"
        if answer.finding is Finding.FOUND and answer.receipt is not None:
            return replace(
                closed,
                trigger=ItemTrigger.FOUND,
                error=None,
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence="query after an uncertain send",
            )
        if answer.finding is Finding.CONFLICT:
            return replace(closed, trigger=ItemTrigger.CONFLICT, error=f"conflict: {message}")
        delay = query_delay(channel)
        if answer.finding is Finding.NOT_FOUND and delay > 0:
            # Too early for a 404 to prove anything: the receiver may still be committing the
            # request that timed out. The item waits, unknown, and is asked about again.
            again = clock.iso(clock.later(delay, at))
            return replace(
                closed,
                trigger=ItemTrigger.LOSE,
                error=f"{message}; not found yet, asking again at {again} (query_delay)",
                next_attempt_at=again,
            )
        if answer.finding is Finding.NOT_FOUND:
            retry = self.policy.judge(
                error,
                attempts=item.attempts,
                elapsed_s=self.elapsed(item),
                idempotent=True,
                queryable=True,
            )
            if retry.action is Action.RETRY:
                # Proven undelivered, so re-sending under the same key is safe.
                self.p.holds[item.seq] = mono + retry.wait_s
                return replace(
                    closed,
                    trigger=ItemTrigger.NOT_FOUND,
                    error=message,
                    next_attempt_at=clock.iso(clock.later(retry.wait_s, at)),
                )
            return replace(
                closed,
                trigger=ItemTrigger.GIVE_UP,
                error=f"gave up after {item.attempts} attempts: {message}",
            )
        return replace(closed, error=f"{message}; may have been delivered, not sent again")

    def elapsed(self, item: Item) -> float:
        if item.attempts <= 1:
            return 0.0
        started = [
            a for a in self.store.attempts(self.run_id, item.seq) if a.outcome != "not_started"
        ]
        first = started[0].started_at
        return (clock.now() - clock.parse(first)).total_seconds()

    def _may_have_reached(self, item: Item) -> bool:
        """Whether an attempt before the current one may have reached the downstream: then a
        replayed answer is the normal dedupe of our own earlier request."""
        if item.attempts <= 1:
            return False
        # Finished attempts only: the open one is the attempt being judged. Attempt numbers
        # are not item.attempts (a released, never-started attempt keeps its row).
        return any(
            a.finished_at is not None and a.outcome not in NEVER_REACHED
            for a in self.store.attempts(self.run_id, item.seq)
        )

    def _maybe_delivered(self, item: Item, error: ChannelError) -> bool:
        if error.kind is ErrorKind.UNCERTAIN:
            return True
        return any(
            a.outcome in (ErrorKind.UNCERTAIN.value, "interrupted")
            for a in self.store.attempts(self.run_id, item.seq)
        )

    def retry_or_give_up(self, item: Item, outcome: Outcome) -> Outcome:
        """A waiting item proven undelivered is sent again like any retry: after the
        backoff, and only while its attempts and deadline last."""
        if outcome.trigger != ItemTrigger.NOT_FOUND:
            return outcome
        retry = self.policy.judge(
            ChannelError(ErrorKind.UNCERTAIN, item.last_error or "outcome unknown"),
            attempts=item.attempts,
            elapsed_s=self.elapsed(item),
            idempotent=True,
            queryable=True,
        )
        if retry.action is Action.RETRY:
            return replace(outcome, next_attempt_at=clock.iso(clock.later(retry.wait_s)))
        return replace(
            outcome,
            trigger=ItemTrigger.GIVE_UP,
            error=f"gave up after {item.attempts} attempts: not delivered (query after "
            "query_delay)",
        )


def _suppressing(closed: Outcome, error: ChannelError, channel: Channel) -> Outcome:
    """A failure that rejects its recipient for good carries the address to the suppression
    list, where its channel's `suppress_on_reject` is on (SMTP's default; other channel types
    have no such option: off). Stored with the failure, in its transaction
    (store/suppressions.py)."""
    if error.suppress_recipient and getattr(channel, "suppress_on_reject", False):
        return replace(
            closed, suppress_address=error.suppress_recipient, suppress_reason=error.suppress_reason
        )
    return closed


def _acknowledged(item: Item, receipt: Receipt) -> Outcome:
    """The downstream accepted the item: sent, with the receipt it gave."""
    return Outcome(
        item.seq, ItemTrigger.ACK, "sent", receipt_id=receipt.receipt_id, receipt_source="send"
    )
