"""The typed records the one decision (decide.py) rests on and returns: what a send
produced, what a status query found, what a channel can do, what the item's earlier
attempts were, and what to do about it. Pure data, and pure functions of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from notifier.domain import clock
from notifier.domain.answers import ChannelError, Receipt
from notifier.domain.records import (
    NEVER_LEFT,
    NEVER_REACHED,
    Attempt,
    AttemptOutcome,
    Item,
    Outcome,
    maybe_delivered,
)


@dataclass(frozen=True)
class NotStarted:
    """A claimed item that `Dispatch.may_start` held back: no request left for it."""

    reason: str


# What one send slot produced: an answer, an error, or no request at all.
Sent = Receipt | ChannelError | NotStarted


class Finding(StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class Answer:
    """What a status query by key found (settle_by_query.ask)."""

    finding: Finding
    receipt: Receipt | None = None
    detail: str = ""
    # The channel answered the query 429 (or 503): it asks to be left alone, like a send's
    # 429, and says nothing of the item (the finding is UNCERTAIN). The asker closes the
    # channel's gate with the error's Retry-After.
    throttled: ChannelError | None = None
    # When the try that got this answer left: the receiver looked the key up after it,
    # however late the answer came back. A 404 is judged by this moment (decide.py). None
    # where no try was made, or the asker did not say.
    asked_at: datetime | None = None


@dataclass(frozen=True)
class Unasked:
    """A query the decision wanted was not made (`why`): the run was stopping (the item
    waits, maybe delivered, to be asked about later), or it was put off."""

    why: str = "the run was stopping"
    # Put off (every query slot taken, or its channel's gate closed), not cut short by a
    # stop: the runner leaves the item in flight, unjudged, and its question pool asks
    # (sending.PutOff), waiting for a slot and the gate, before it is judged.
    put_off: bool = False


class Capable(Protocol):
    """A channel, as far as its capabilities go (channels.Channel has these)."""

    idempotent: bool
    queryable: bool
    # The receiver's window: how long after a request left it may still commit it (its
    # timeout), and how much longer a status query may not see it yet (its query_delay).
    # Every channel states both, 0 where none applies: a default here once gave a channel
    # with a timeout no window at all, and a 404 or a not-sent mark was taken at once.
    timeout_s: float
    query_delay_s: float
    suppress_on_reject: bool  # SMTP's option (default on); off on every other channel type


@dataclass(frozen=True)
class Caps:
    """What a channel's capabilities say about an uncertain answer."""

    idempotent: bool
    queryable: bool
    query_delay_s: float = 0.0
    timeout_s: float = 0.0
    suppress_on_reject: bool = False

    @classmethod
    def of(cls, channel: Capable) -> Caps:
        return cls(
            idempotent=channel.idempotent,
            queryable=channel.queryable,
            query_delay_s=channel.query_delay_s,
            timeout_s=channel.timeout_s,
            suppress_on_reject=channel.suppress_on_reject,
        )


@dataclass(frozen=True)
class History:
    """The item's attempts as stored (store.queries.attempts), oldest first; the open one (being
    judged) included. Empty for a first attempt: nothing earlier can matter then."""

    attempts: tuple[Attempt, ...] = ()

    @classmethod
    def of(cls, attempts: Sequence[Attempt]) -> History:
        return cls(tuple(attempts))

    def elapsed_s(self, item: Item, now: datetime) -> float:
        """Since the first attempt that started (the policy's deadline counts from it)."""
        started = [a for a in self.attempts if a.outcome not in NEVER_LEFT]
        if item.attempts <= 1 or not started:
            return 0.0
        return (now - clock.parse(started[0].started_at)).total_seconds()

    def may_have_reached(self, item: Item) -> bool:
        """Whether an attempt before the current one may have reached the downstream: then a
        replayed answer is the normal dedupe of our own earlier request. Finished attempts
        only: the open one is the attempt being judged (attempt numbers are not
        item.attempts: a released, never-started attempt keeps its row)."""
        return item.attempts > 1 and any(
            a.finished_at is not None and a.outcome not in NEVER_REACHED for a in self.attempts
        )

    def throttled(self) -> int:
        """How many finished attempts were throttled: they count against no max_attempts."""
        return sum(
            1
            for a in self.attempts
            if a.finished_at is not None and a.outcome == AttemptOutcome.THROTTLED
        )

    def maybe_delivered(self) -> bool:
        """Whether some attempt may have delivered the item (records.maybe_delivered: the
        rule the store's SQL reads too)."""
        return any(maybe_delivered(a) for a in self.attempts)

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


def request_window(caps: Caps, started: datetime | None, ended: datetime) -> datetime:
    """Until when the receiver may still commit a request that left at `started` and ended
    at `ended` (docs/design.md section 2: a receiver that has not committed a request
    `timeout + query_delay` after it LEFT never will). Counted from the start, whatever
    ended the attempt: a gateway's 504 or a reset can end it at once while the receiver
    behind still commits it; and never before `ended + query_delay`. A start not known
    (None) is taken as `ended`, the latest it can have been."""
    window = caps.timeout_s + caps.query_delay_s
    return max(
        clock.later(window, started if started is not None else ended),
        clock.later(caps.query_delay_s, ended),
    )


def not_found_counts_from(
    caps: Caps, attempts: Sequence[Attempt], now: datetime
) -> datetime | None:
    """The moment from which a 404 proves "not sent": the latest moment until which the
    receiver may still commit a request of any of `attempts` (the item's, oldest first)
    that may have reached it (`request_window`: from each request's recorded start, the
    moment it left). An attempt left open by a process that is gone has no known start:
    its `started_at` is when it was claimed, and an item claimed ahead may have waited in
    the queue for seconds before its request left, as late as the moment the holder was
    found gone (`now`: whoever settles it took the run over first). So its request may
    run until `now` plus the timeout. An attempt closed as `interrupted` was closed at that
    moment. A channel that dedupes by key waits too: a 404 taken as proof can end the item
    as never delivered (failed, expired, pending in a cancelled run), and sending the file
    again then plans it under a new key. None: a 404 is proof at once (no attempt may have
    reached the receiver, or its write is atomic: the outbox)."""
    if caps.query_delay_s + caps.timeout_s <= 0:
        return None
    bounds = []
    for attempt in attempts:
        if attempt.outcome in NEVER_REACHED:
            continue
        if attempt.finished_at is None:
            bounds.append(request_window(caps, None, now))
        elif attempt.outcome == AttemptOutcome.INTERRUPTED:
            bounds.append(request_window(caps, None, clock.parse(attempt.finished_at)))
        else:
            started = clock.parse(attempt.started_at)
            bounds.append(request_window(caps, started, clock.parse(attempt.finished_at)))
    return max(bounds, default=None)


class Moment(StrEnum):
    """Who settles an item by a query's finding, which decides what a 404 leads to."""

    SETTLE = "settle"  # resume, reconcile, a dead worker's items: in_flight or unknown
    REVISIT = "revisit"  # the runner: an unknown item whose query_delay came due
    CANCEL = "cancel"  # cancel: a pending item whose earlier attempt may have been delivered


@dataclass(frozen=True)
class AfterSend:
    """A send's result and, where the decision asked for one, its status query's answer
    (None: not asked yet; Unasked: the run was stopping), and when its request left."""

    result: Sent
    finding: Answer | Unasked | None = None
    started: datetime | None = None  # when its request left (None: not known)
    # A throttled answer whose sender closed the channel at once for this wait: the
    # decision uses it rather than draw another, so gate and hold agree with the sender's.
    gate_s: float | None = None


@dataclass(frozen=True)
class Settling:
    """A query's finding about an item not under a send (None: the channel cannot be
    queried), and from when a 404 counts (`not_found_counts_from`, at the question)."""

    moment: Moment
    finding: Answer | None
    not_found_from: datetime | None = None
    # The item's run is completed or cancelled: an item proven undelivered is not sent by
    # it any more (only by sending the file again), and its line says so.
    run_finished: bool = False


class HaltCause(StrEnum):
    """Why a decision halts the run (the engine's run control stops it so)."""

    HALTED = "halted"  # a safety rule: an endpoint gone, unknown outcomes in a row
    # As for a conflict (exit 4): the downstream answers a conflict under our key, or
    # answers under it for something no attempt of ours can account for.
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Halt:
    """The run halts: why (`cause`), and in words for people (`detail`)."""

    cause: HaltCause
    detail: str


@dataclass(frozen=True)
class Decision:
    """What to record (None: nothing established, nothing changes) and what this process
    does meanwhile: hold the item back, close its channel, halt the run."""

    outcome: Outcome | None
    line: str = ""  # what a settlement says, one line
    ask: bool = False  # the answer means nothing until the channel is asked by key
    hold_s: float | None = None  # the item waits this long in this process
    gate_s: float | None = None  # its channel closes this long (a throttled answer)
    halt: Halt | None = None  # the run halts for this (an endpoint gone, a replay unexplained)
