"""The sender side of a run: what a sender thread checks at the moment its request would
leave, the request itself, what it tells every other sender the moment an answer arrives,
and every status query asked mid-run: after an uncertain answer that the decision says only
a query can settle, and the questions the committer hands out (the revisit of an item whose
query_delay came due, a dead worker's items adopted). The committer decides each answer in
full, with the query's finding, and is the only one that writes: while one sender waits for
its query, the other answers are recorded.

A check made when an item was claimed is not enough: an item claimed ahead may wait behind
a slow request, a channel's lock or a --rate token, while a cancel, a halt, a 429, an
expired approval, a passed deadline, a closed window or a suppression arrives. So every one
of them is checked again here, right before the send, and once more by the channel when its
connection is ready (a greeting or a login may take seconds): the channel asks (`_ready`),
so it never needs to know the rules.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from datetime import datetime

from notifier.channels import Channel, Ready, Withheld
from notifier.content import schedule
from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.decide import (
    Answer,
    Caps,
    Finding,
    History,
    Unasked,
    unexplained_replay,
    wants_finding,
)
from notifier.domain.records import Item
from notifier.domain.retry import RetryPolicy
from notifier.engine.coordination import RunOptions
from notifier.engine.domain_rates import DomainRates, domain_of
from notifier.engine.judging import NotStarted, Progress, SendResult, Sent
from notifier.engine.pipeline import POLL_S, SharedBucket, TokenBucket, in_flight_cap
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.settle_by_query import THROTTLED_ASKS, Question, ask
from notifier.observe import Observer
from notifier.store import LeaseLost


@dataclass(frozen=True)
class Asked:
    """A sender's answer to a committer's question: what the query found (None: the
    channel cannot be queried, nothing was asked; Unasked: the run was stopping) and when."""

    question: Question
    answer: Answer | Unasked | None
    at: datetime


def is_put_off(slot: SendResult | Asked) -> bool:
    """A send's slot whose status query was put off (every query slot taken, or its
    channel's gate closed: `Unasked.put_off`): its item stays in flight, unjudged (still
    counted by the uncertain-answers brake), until the question pool has asked."""
    return (
        not isinstance(slot, Asked) and isinstance(slot.finding, Unasked) and slot.finding.put_off
    )


_SUPPRESSED_SINCE = "its recipient was put on the suppression list after it was claimed"


class Dispatch:
    """Starts sends and asks questions for one run's sender threads (or, at N = 1, the
    committer's own)."""

    def __init__(
        self,
        channels: Mapping[str, Channel],
        policy: RetryPolicy,
        options: RunOptions,
        progress: Progress,
        *,
        control: RunControl,
        lease_valid: Callable[[], bool],
        read_flags: Callable[[], bool],
        listed: Callable[[Item], bool] = lambda item: False,
        observer: Observer,
        buckets: Mapping[str, TokenBucket | SharedBucket],
        domains: DomainRates,
    ) -> None:
        self.channels = channels
        self.policy = policy
        self.options = options
        self.p = progress
        # Whether to stop: every check below reads it, and a sender asks it to stop (a lost
        # lease, an answer that halts the run, a --rate wait past --max-wait).
        self.control = control
        self.lease_valid = lease_valid  # Lease.surely_valid: checked right before each send
        # The committer's read of the run's flags (it tells the run control of a cancel): at
        # N = 1 a --rate wait holds up the committer's own turn, so the wait reads them itself.
        self.read_flags = read_flags
        # Whether an item's recipient is on the suppression list now, read on the committer's
        # connection: at N = 1 the send runs on the committer's own thread, whose look at
        # the list (`suppressed_seen`) cannot happen while that send waits for a --rate
        # token or its connection, so the sender reads the list itself.
        self.listed = listed
        self.observer = observer  # metrics and JSON logs; a no-op without either
        self.buckets = buckets
        self.domains = domains  # domain_rates: a channel's token first, then its domain's
        # A channel with a cap on its sends at once (one connection, or a pool of them:
        # SMTP) never has more items in flight, so after a kill its unknown items are at
        # most the requests really under way, never a queue claimed behind it (in_flight_cap).
        self.caps = {
            name: cap for name, channel in channels.items() if (cap := in_flight_cap(channel))
        }
        # The lock is a second line: the claim already keeps one item of such a channel in
        # flight at a time (Runner._commit).
        self._locks = {name: threading.Lock() for name, cap in self.caps.items() if cap == 1}
        # Uncertain answers in a row from channels that cannot dedupe, as the senders see
        # them: at the unknown-streak limit no send starts until the committer has judged
        # them (a streak of unknowns halts the run; it must not grow by N more first).
        self._doubted = 0
        self._doubted_lock = threading.Lock()
        self._flags_due = 0.0  # at N = 1, when a --rate wait next reads the flags
        # The earlier attempts of each retry handed to a sender, read by the committer when
        # it claimed the item: whether an uncertain answer needs a query rests on them.
        self.histories: dict[int, History] = {}
        # The items in flight whose recipient the committer last found on the suppression
        # list (put there after their claim): the senders start none of them. Replaced
        # whole by the committer, its one writer (Runner._revisit).
        self.suppressed_seen: frozenset[int] = frozenset()
        # Status queries under way at once, whoever asks (a sender after an uncertain answer,
        # or the committer's question pool): never every sender, so sending goes on while
        # a status endpoint holds its answers. At N = 1, the committer's own one.
        self.query_slots = max(1, options.concurrency // 2)
        # The slots of sends whose query was put off, by item, handed to the question pool
        # with their item (Runner._pipeline): its one writer, the committer, then the pool.
        self.put_off: dict[int, SendResult] = {}
        self._queries = threading.BoundedSemaphore(self.query_slots)

    def may_start(self, item: Item | None = None) -> str | None:
        """Why the next send (of `item`) must not start now, or None: the run control's
        checks (a stop in force: Ctrl-C, a halt, an expired approval, a cancel, another
        worker's move; the item's not_after), then the senders' brake. Called inside the
        channel lock right before the send, so an item queued behind a slow request is
        checked at the moment it would start, not when it was claimed; also while waiting
        for a --rate token. The requests already under way finish and are recorded, nothing
        else leaves."""
        stopped = self.control.may_start(item, clock.now())
        if stopped is not None:
            return stopped
        # Uncertain answers in a row: those judged (the committer's streak) plus those the
        # senders saw and the committer has not judged yet.
        if self.braked():
            doubted = self._doubted + self.p.unknown_streak
            return f"{doubted} uncertain answers in a row are being judged"
        return None

    def item_may_start(self, item: Item) -> str | None:
        """Why `item`'s request must not start now, or None: the run's checks (may_start),
        its channel's 429/503 gate, its send window and the suppression list. Each depends
        on the moment, so it is asked right before the send and again once the channel's
        connection is ready (`_ready`)."""
        return (
            self.may_start(item)
            or self._gated(item)
            or schedule.closed(item)  # a send window closed meanwhile
            or self._suppressed(item)
        )

    def _suppressed(self, item: Item) -> str | None:
        """Its recipient was put on the suppression list after it was claimed: it does not
        start (released, never attempted; the next claim moves it to suppressed)."""
        if item.seq in self.suppressed_seen:
            return _SUPPRESSED_SINCE
        return None

    def _listed_now(self, item: Item) -> str | None:
        """At N = 1, the last check's own read of the suppression list (`listed`): the
        committer's look cannot happen while its own thread waits for a connection or a
        --rate token. A read that fails holds the item back (released, never attempted):
        nothing has left, and nothing may leave unchecked."""
        if self.options.concurrency != 1:
            return None
        try:
            listed = self.listed(item)
        except Exception as exc:  # locked past the busy timeout, a dropped connection
            return f"the suppression list could not be read ({type(exc).__name__}: {exc})"
        return _SUPPRESSED_SINCE if listed else None

    def _ready(self, item: Item, left: list[datetime]) -> Ready:
        """The last check the channel asks once its connection is ready, right before it
        hands the message over (SMTP: before MAIL FROM, after a greeting, EHLO, STARTTLS and
        login that may take seconds): the lease is still surely ours, and the item may
        still start. When it may, the moment is noted in `left`: the request leaves then,
        and its query window counts from there, not from before a slow connection."""

        def ready() -> str | None:
            if not self._lease_allows_send():
                return "this worker can no longer prove the run is its own"
            reason = self.item_may_start(item) or self._listed_now(item)
            if reason is None:
                left.append(clock.now())
            return reason

        return ready

    def braked(self) -> bool:
        """Whether the uncertain-answers brake holds every send back: the answers judged
        (the committer's streak) plus those the senders saw and the committer has not
        judged yet (their status queries may still be under way) reach the limit."""
        return self._doubted + self.p.unknown_streak >= self.options.unknown_streak_limit

    def judged(self, doubted: int) -> None:
        """`doubted` answers the senders counted were judged by the committer: its streak
        holds them from here on. Only these: others may still wait to be judged."""
        if doubted:
            with self._doubted_lock:
                self._doubted = max(0, self._doubted - doubted)

    def doubts(self, item: Item, result: Sent | None) -> bool:
        """An answer that counts toward the uncertain-answers brake: maybe delivered, on a
        channel that cannot dedupe a second request."""
        return (
            isinstance(result, ChannelError)
            and result.kind is ErrorKind.UNCERTAIN
            and not self.channels[item.channel].idempotent
        )

    def work(self, job: Item | Question) -> SendResult | Asked:
        """What a sender does with what the committer handed it: send an item (point A
        committed), or ask about one; on the question pool, also ask the query a send's
        answer needs that was put off (`is_put_off`), and hand its slot back with the finding,
        as the sender would have."""
        if isinstance(job, Question):
            return self.ask_about(job)
        slot = self.put_off.pop(job.seq, None)
        if slot is not None:
            return replace(slot, finding=self.asked(job, wait=True))
        return self.send_one(job)

    def ask_about(self, question: Question) -> Asked:
        """The committer's question, asked here so that it records the other answers while
        this one waits (a channel that cannot be queried is not asked: nothing to wait for).
        It waits for its channel's gate and a free query slot: on a thread of the question
        pool (pipeline.Senders), which sends nothing."""
        channel = self.channels[question.channel]
        answer = self.asked(question.item, wait=True) if channel.queryable else None
        return Asked(question, answer, clock.now())

    def send_one(self, item: Item) -> SendResult:
        """The result and the moment it arrived, on the wall clock (to record) and on the
        monotonic clock (to wait): waits (Retry-After) count from then. None: not sent at
        all, because this worker can no longer prove the run is its own."""
        result: Sent
        started: datetime | None = None
        history = self.histories.pop(item.seq, History())
        try:
            with self._locks.get(item.channel) or nullcontext():
                bucket = self.buckets.get(item.channel)
                asked = time.monotonic()
                wait = (
                    None
                    if bucket is None
                    else bucket.take(self._send_stopped, self.options.max_wait_s)
                )
                if bucket is not None:
                    self.observer.rate_waited(item.channel, time.monotonic() - asked)
                by_domain = False
                if wait is None:
                    wait = self.domains.take(item, self._send_stopped, self.options.max_wait_s)
                    by_domain = wait is not None
                # Every check at the moment the request would start, after any wait for the
                # channel's lock or a --rate token; the channel asks them all again once its
                # connection is ready (`ready`), right before the message is handed over.
                if not self._lease_allows_send():
                    return SendResult(None, clock.now(), time.monotonic())
                reason = self.item_may_start(item)
                if reason is None and wait is not None:
                    # Named only when it holds the send back: never worked out per send.
                    limit = (
                        f"the channel's rate for {domain_of(item.target)} (domain_rates)"
                        if by_domain
                        else "the channel's --rate"
                    )
                    if wait > self.options.max_wait_s:
                        # The run pauses until then, rather than wait past --max-wait.
                        self.control.request(
                            Stop.RATE_LIMITED,
                            f"{limit} allows its next send",
                            until=time.monotonic() + wait,
                        )
                    reason = f"waiting for {limit} ({wait:.1f}s to the next send)"
                if reason is not None:
                    return SendResult(NotStarted(reason), clock.now(), time.monotonic())
                # The attempt's real start: an item claimed ahead waited in the queue
                # since its claim, which opened the attempt (see Outcome.started_at).
                started = clock.now()
                self.observer.attempt_started(item)
                left: list[datetime] = []
                try:
                    result = self.channels[item.channel].send(
                        item.intent(), self._ready(item, left)
                    )
                finally:
                    # The request left once its connection was ready (a reconnect may ask
                    # again: the last time counts), not before connecting.
                    started = left[-1] if left else started
        except Withheld as withheld:
            # The channel's connection took long enough for a check to fail meanwhile:
            # nothing of the message left. Released never attempted, like the checks above.
            if self.control.lost:
                return SendResult(None, clock.now(), time.monotonic())
            return SendResult(NotStarted(withheld.reason), clock.now(), time.monotonic())
        except ChannelError as exc:
            result = exc
        except Exception as exc:  # a channel bug: the request may have left, so be careful
            result = ChannelError(ErrorKind.UNCERTAIN, f"unexpected {type(exc).__name__}: {exc}")
        mono, at = time.monotonic(), clock.now()
        self.observer.answered(item, result, started)
        gate_s = None
        with suppress(Exception):  # a warning only: the committer judges the answer in full
            gate_s = self._warn(item, result, history, mono)
        finding = self._query(item, result, history, at)
        return SendResult(result, at, mono, started, finding, gate_s)

    def _query(
        self, item: Item, result: Sent, history: History, at: datetime
    ) -> Answer | Unasked | None:
        """The status query an uncertain answer needs before it means anything (the
        decision says so: a channel that can be asked, and cannot dedupe or is out of
        attempts), asked here, on this sender's thread, so the committer goes on recording
        the other answers meanwhile. None: no query wanted (or a bug deciding that: the
        committer then leaves the item unknown, asked about later); Unasked: the run is
        stopping, no new request starts (the item waits, unknown, for whoever settles the
        run next)."""
        if not isinstance(result, ChannelError):
            return None
        channel = self.channels[item.channel]
        try:
            wanted = wants_finding(
                item, result, caps=Caps.of(channel), policy=self.policy, history=history, now=at
            )
        except Exception:
            return None
        if not wanted:
            return None
        return self.asked(item)

    def asked(self, item: Item, *, wait: bool = False) -> Answer | Unasked:
        """The one way to ask the channel about an item mid-run: Unasked when the run is
        stopping (no new request starts; the item waits, unknown or in flight, for whoever
        settles the run next). A query honours its channel's 429/503 gate and takes a query
        slot, as a send honours the gate: after a send (`wait` False) it starts at once or
        not at all, the item then left unknown to be asked about later and the sender free
        to send; a question (`wait`) waits for both. A throttled answer closes the gate for
        its Retry-After (at least the backoff): a question is asked again once it opens, up
        to THROTTLED_ASKS throttled answers of its own, and then answered that the channel
        throttles its queries (its item stays unknown for the next settling pass to ask)."""
        throttled = 0
        while True:
            if not self._may_ask():
                return Unasked()
            gated = self._gated(item)
            if gated is None and self._queries.acquire(blocking=False):
                try:
                    answer = self._ask(item)
                finally:
                    self._queries.release()
                if isinstance(answer, Unasked):
                    if wait:
                        continue  # cut short by a stop (seen above) or a gate: wait for it
                    return answer
                if answer.throttled is None:
                    return answer
                wait_s = self.policy.backoff(answer.throttled, 1)
                self.p.gate(item.channel, time.monotonic() + wait_s)
                gated = f"the channel throttled the query ({answer.throttled})"
                throttled += 1
                if wait and throttled >= THROTTLED_ASKS:
                    return Answer(
                        Finding.UNCERTAIN,
                        detail=f"not asked again: the channel throttled the query "
                        f"{throttled} times ({answer.throttled})",
                    )
            if not wait:
                why = gated or f"all {self.query_slots} query slots were taken"
                return Unasked(why, put_off=True)
            opens = self.p.gates.get(item.channel, 0.0) - time.monotonic()
            self.control.wait(min(POLL_S, max(opens, POLL_S / 4)))  # a stop ends it at once

    def _ask(self, item: Item) -> Answer | Unasked:
        """One query, in a slot, with its tries: each further one asked for too (a stop, or
        a gate another answer closed, does not wait for three timeouts)."""
        channel = self.channels[item.channel]
        try:
            answer = ask(channel, item, go_on=lambda: self._may_ask() and self._gated(item) is None)
        except Exception as exc:  # a channel bug: the query decides nothing
            return Answer(
                Finding.UNCERTAIN, detail=f"query failed: unexpected {type(exc).__name__}: {exc}"
            )
        if answer.finding is Finding.UNCERTAIN and answer.throttled is None:
            if not self._may_ask():
                # The stop cut its tries short: the item waits, unknown, to be asked about by
                # whoever settles the run next, like one not asked at all. Recorded as a plain
                # unknown, every sender's query cut short by one Ctrl-C would count toward the
                # unknown-streak halt, and a run that is only stopping would halt.
                return Unasked()
            if (gated := self._gated(item)) is not None:
                return Unasked(gated, put_off=True)  # another answer closed the gate
        return answer

    def _may_ask(self) -> bool:
        """Whether a status query may start (or try again): not once the run is stopping
        (a signal, a halt, an expired approval, a cancel, a --rate pause, a lost lease),
        when each query, tried three times, may take the channel's timeout while the stop
        waits. At N = 1 this is the committer's own thread: the run's flags are read now."""
        if self.options.concurrency == 1:
            try:
                if self.read_flags():
                    return False
            except LeaseLost as lost:
                self.control.lose(lost.cause)
        return self.control.may_ask(clock.now())

    def _send_stopped(self) -> bool:
        """Stop waiting for a --rate token: the lease is lost, or the send may not start. At
        N = 1 the wait is on the committer's own thread, whose turn it holds up: the flags
        are read here then (at most every POLL_S), or a cancel would go unseen for the whole
        wait."""
        if self.options.concurrency == 1 and time.monotonic() >= self._flags_due:
            self._flags_due = time.monotonic() + POLL_S
            try:
                if self.read_flags():
                    return True
            except LeaseLost as lost:
                self.control.lose(lost.cause)
        return self.control.lost or self.may_start() is not None

    def _warn(
        self, item: Item, result: Receipt | ChannelError, history: History, mono: float
    ) -> float | None:
        """What every other sender must know the moment this answer arrives, not after the
        committer's next gather and commit: a throttled answer closes its channel's gate,
        and an answer that halts the run (410, 422, a receipt for another digest, a replay
        no attempt of ours can explain: `history` holds the earlier attempts) stops
        every send not yet started (asked of the run control as provisional: the committer's
        judgement of the answer says how the run ends). Returns the wait a throttle closed
        the channel for."""
        if isinstance(result, Receipt):
            if result.intent_digest and result.intent_digest != item.intent_digest:
                self.control.request(
                    Stop.CONFLICT, f"conflict on item {item.seq}", provisional=True
                )
            elif unexplained_replay(item, result, history):
                self.control.request(
                    Stop.CONFLICT, f"unexplained replay on item {item.seq}", provisional=True
                )
            with self._doubted_lock:
                self._doubted = 0
            return None
        if self.doubts(item, result):
            with self._doubted_lock:
                self._doubted += 1
        if result.kind in (ErrorKind.GONE, ErrorKind.CONFLICT):
            cause = Stop.CONFLICT if result.kind is ErrorKind.CONFLICT else Stop.HALTED
            detail = f"{result.kind.value} answer for item {item.seq}"
            self.control.request(cause, detail, provisional=True)
        elif result.kind is ErrorKind.THROTTLED:
            channel = self.channels[item.channel]
            # The wait a retry would take (never less than Retry-After); elapsed time only
            # decides whether this item retries, not how long its channel waits.
            verdict = self.policy.judge(
                result,
                attempts=item.attempts,
                elapsed_s=0.0,
                idempotent=channel.idempotent,
                queryable=channel.queryable,
            )
            self.p.gate(item.channel, mono + verdict.wait_s)
            return verdict.wait_s
        return None

    def _gated(self, item: Item) -> str | None:
        """A 429/503 closed the item's channel after it was claimed: it does not start now
        (released, never attempted) and is claimed again once the gate opens."""
        until = self.p.gates.get(item.channel)
        if until is not None and until > time.monotonic():
            return f"channel {item.channel!r} paused by a throttled answer"
        return None

    def _lease_allows_send(self) -> bool:
        """Fencing guards writes, not sends: a worker frozen after point A and thawed after
        another took the run over must not send. Checked right before each send."""
        if self.control.lost:
            return False
        if not self.lease_valid():
            self.control.lose_stale()
            return False
        return True
