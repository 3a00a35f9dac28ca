"""The send loop: settle what was in flight, then a continuous pipeline of
point A (intents + attempts durable) → send → point B (outcomes durable).

Up to N sends are in flight at once on N sender threads (pipeline.py); this thread is the
only one that writes, and each of its transactions records the outcomes that came back and
claims their replacements together (a group commit). N = 1 sends in this thread: the strict
sequential protocol.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from . import approval, clock
from .channels import Channel, ChannelError, ErrorKind, Receipt
from .crash import CrashPlan
from .judging import Judge, NotStarted, Progress, Sent, Slot, Stop
from .lease import holder_alive
from .observe import NULL_OBSERVER, Observer
from .pipeline import (
    GATHER_PER_N_AHEAD_S,
    Senders,
    SharedBucket,
    TokenBucket,
    claim_ahead,
    in_flight_cap,
)
from .reconcile import settle, settle_doubts, settle_items
from .records import Counts, Item, Outcome, PendingKind
from .retry import Action, RetryPolicy
from .signals import Interruption
from .state_machine import FINISHED_RUN_STATES, ItemState, ItemTrigger, RunState, RunTrigger
from .store import LeaseLost, Store

POLL_S = 0.2
# How the reasons of two pauses begin, so that another worker of a shared run tells them
# apart (run.stop_reason) and ends with the right exit code and advice.
APPROVAL_PAUSE = "its approval"
CHANNEL_DOWN_PAUSE = " is down: "
# The expiry of an approval whose record is gone or names other content: long past.
_WITHDRAWN = datetime.min.replace(tzinfo=UTC)
# How often a worker of a shared run looks for dead workers whose items it must settle.
REAP_S = 1.0


@dataclass(frozen=True)
class RunOptions:
    concurrency: int = 1
    max_wait_s: float = 600.0
    unknown_streak_limit: int = 5
    rate: float | None = None  # --rate: sends per second per channel (over its own `rate`)
    # `resume` restarts a paused or halted run; a `worker` only joins one that is going, so a
    # halt (an endpoint gone, a conflict) holds until an operator resumes the run.
    restart: bool = True


@dataclass(frozen=True)
class RunResult:
    """How a run stopped: its state, why, what happened (no command hints) and the counts."""

    state: RunState
    stop: Stop
    reason: str
    counts: Counts
    paused_until: str | None = None


class Runner:
    def __init__(
        self,
        store: Store,
        run_id: str,
        channels: Mapping[str, Channel],
        policy: RetryPolicy,
        options: RunOptions,
        *,
        lease_version: int,
        lease_lost: threading.Event,
        interrupted: Interruption,
        crash: CrashPlan | None = None,
        say: Callable[[str], None] = print,
        advance: Callable[[int], None] = lambda n: None,
        lease_valid: Callable[[], bool] = lambda: True,
        channel_rates: Mapping[str, float | None] | None = None,
        observer: Observer = NULL_OBSERVER,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.channels = channels
        self.policy = policy
        self.options = options
        self.lease_version = lease_version
        self.lease_lost = lease_lost
        self.interrupted = interrupted
        self.crash = crash
        self.lease_valid = lease_valid  # Lease.surely_valid: checked right before each send
        # A run shared with other workers (PostgreSQL): this process holds a worker lease of
        # its own (store.worker_id).
        self.shared = store.worker_id is not None
        self._reap_at = 0.0
        self.observer = observer  # metrics and JSON logs (notifier/observe); a no-op without
        self.p = Progress(say, advance, on_gate=observer.gated)
        self.judge = Judge(store, run_id, channels, policy, self.p)
        # A channel with a cap on its sends at once (one connection, or a pool of them:
        # SMTP) never has more items in flight, so after a kill its unknown items are at
        # most the requests really under way, never a queue claimed behind it (in_flight_cap).
        self._caps = {
            name: cap for name, channel in channels.items() if (cap := in_flight_cap(channel))
        }
        # The lock is a second line: the claim already keeps one item of such a channel in
        # flight at a time (see _commit).
        self._locks = {name: threading.Lock() for name, cap in self._caps.items() if cap == 1}
        # Set by a sender the moment an answer means the run halts (410, 422, a receipt for
        # another digest), before the committer has judged it: no other send starts.
        self._halting: str | None = None
        # Uncertain answers in a row from channels that cannot dedupe, as the senders see
        # them: at the unknown-streak limit no send starts until the committer has judged
        # them (a streak of unknowns halts the run; it must not grow by N more first).
        self._doubted = 0
        self._doubted_lock = threading.Lock()
        # The run's approval, when it needs one: the fingerprint it approved, and its expiry,
        # at or after which no send starts (read again at each revisit, so `notifier approve`
        # renewing it mid-run counts). None: the run needs no approval.
        self._approved: str | None = None
        self._approval_until: datetime | None = None
        # The run's cancel request as this thread last read it, after each transaction that
        # claimed items and at each turn: the senders check it before each send (_may_start)
        # instead of asking the database. `cancel` returns only once this process has moved
        # the run to cancelled, with nothing in flight: a send that starts on a value not yet
        # refreshed is one that cancel waits for (docs/guarantees.md, Cancel).
        self._cancel_seen: str | None = None
        self._flags_due = 0.0  # at N = 1, when a --rate wait next reads the flags
        # A shared run's --rate buckets live in the database: the senders take their tokens
        # through a connection of their own (this thread's is busy committing), one at a time.
        self._bucket_lock = threading.Lock()
        self._bucket_store: Store | None = None
        # One token bucket per rate-limited channel, shared by all its senders: --rate for
        # the run, else the channel's own `rate`.
        rates = channel_rates or {}
        self._buckets: dict[str, TokenBucket | SharedBucket] = {
            name: self._bucket(name, rate)
            for name in channels
            if (rate := options.rate or rates.get(name))
        }
        # Items claimed ahead of the N being sent, point A committed (see claim_ahead).
        self._ahead = claim_ahead(options.concurrency, channels.values())
        self._senders: Senders[Slot] = Senders(
            options.concurrency,
            self._send_one,
            gather_s=GATHER_PER_N_AHEAD_S * self._ahead / options.concurrency,
        )
        self._revisit_at = 0.0  # when to look again for query_delay revisits that came due
        # Set when a --rate allows a channel's next send only after more than --max-wait:
        # the monotonic time of that send, until which the run pauses.
        self._rate_wake: float | None = None

    # ------------------------------------------------------------------ top level

    def run(self) -> RunResult:
        try:
            return self._run()
        finally:
            # Whatever ended the committer (a storage failure included), a sender that has
            # taken an item starts no request nobody would record.
            if self._halting is None:
                self._halting = "the worker is stopping"
            self._senders.close()
            if self._bucket_store is not None and self._bucket_store is not self.store:
                self._bucket_store.close()

    def _run(self) -> RunResult:
        run = self.store.get_run(self.run_id)
        if run.state in FINISHED_RUN_STATES:
            # A `cancel` (or another process) finished the run between our plan or read and
            # our lease: there is nothing to send, and no move is legal any more.
            return RunResult(
                run.state,
                Stop.ALREADY_FINISHED,
                f"already {run.state.value}; nothing was sent by this process",
                self.store.counts(self.run_id),
            )
        if self.shared:
            # Other workers may be moving the run too: each move only from where it is.
            start = (RunState.PLANNED, RunState.APPROVED)
            self.store.move_run_from(self.run_id, RunTrigger.START, self.lease_version, start)
            if self.options.restart:
                self.store.move_run_from(
                    self.run_id,
                    RunTrigger.RESUME,
                    self.lease_version,
                    (RunState.PAUSED, RunState.HALTED),
                    paused_until=None,
                    stop_reason=None,
                )
            state = self.store.get_run(self.run_id).state
            if state is not RunState.RUNNING:
                return self._moved_by_another(state)
        elif run.state in (RunState.PLANNED, RunState.APPROVED):
            self.store.move_run(self.run_id, RunTrigger.START, self.lease_version)
        elif run.state in (RunState.PAUSED, RunState.HALTED):
            self.store.move_run(
                self.run_id,
                RunTrigger.RESUME,
                self.lease_version,
                paused_until=None,
                stop_reason=None,
            )
        self._read_approval()
        # Gates an earlier process was given: its wall-clock time, converted once.
        for channel, until in self.store.throttled_until(self.run_id).items():
            self.p.gate(channel, time.monotonic() + _seconds_until(clock.parse(until)))
        halted = self._settle_first()
        if halted is not None:
            return halted
        return self._pipeline()

    def _read_approval(self) -> None:
        """The run's approval as stored now, for a run that needs one (its fingerprint and
        expiry were checked before the lease was taken: app.check_can_send). A record gone,
        or bound to another fingerprint, counts as expired: nothing more is sent."""
        run = self.store.get_run(self.run_id)
        if not approval.requires_approval(run):
            return
        current = approval.stored_approval(run)
        if current is None or current.fingerprint != (self._approved or current.fingerprint):
            self._approval_until = _WITHDRAWN
            return
        self._approved = current.fingerprint
        self._approval_until = clock.parse(current.expires_at)

    def _approval_expired(self) -> bool:
        """Whether the run needs an approval that has expired (checked before every send)."""
        return self._approval_until is not None and clock.now() >= self._approval_until

    def _settle_first(self) -> RunResult | None:
        """Nothing new starts until every item whose outcome is open has been settled (on a
        shared run: every such item no live worker holds, adopted first)."""
        if self.shared:
            self._adopt_and_settle()
            if self.p.halt is not None:
                return self._halt(*self.p.halt)
            return None
        settlements = settle(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            include_unknown=True,
            say=self.p.say,
        )
        for s in settlements:
            if s.outcome is not None and s.outcome.trigger == ItemTrigger.CONFLICT:
                return self._halt(
                    Stop.CONFLICT, f"conflict on item {s.item.seq}: {s.outcome.error}"
                )
        return None

    def _settle_waiting(self) -> None:
        """Ask again about unknown items whose query_delay has passed (a 404 now counts). A
        conflict halts the run once nothing is in flight."""
        due = self.store.waiting_for_query(self.run_id, due_by=clock.now_iso())
        if not due:
            return
        settlements = settle_items(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            due,
            self.p.say,
            adjust=self._retry_or_give_up,
        )
        for s in settlements:
            if s.outcome is None:
                continue
            if s.outcome.trigger == ItemTrigger.CONFLICT and self.p.halt is None:
                self.p.halt = (Stop.CONFLICT, f"conflict on item {s.item.seq}: {s.outcome.error}")
            if s.outcome.trigger in (ItemTrigger.FOUND, ItemTrigger.UNDECIDED, ItemTrigger.GIVE_UP):
                self.p.advance(1)

    def _retry_or_give_up(self, item: Item, outcome: Outcome) -> Outcome:
        """A waiting item proven undelivered is sent again like any retry: after the
        backoff, and only while its attempts and deadline last."""
        if outcome.trigger != ItemTrigger.NOT_FOUND:
            return outcome
        retry = self.policy.judge(
            ChannelError(ErrorKind.UNCERTAIN, item.last_error or "outcome unknown"),
            attempts=item.attempts,
            elapsed_s=self.judge.elapsed(item),
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

    def _stop_requested(self) -> RunResult | None:
        if self.lease_lost.is_set():
            raise LeaseLost(f"run {self.run_id}: another process took over this run")
        if self.interrupted.is_set():
            stop = (
                Stop.TERMINATED if self.interrupted.signum == signal.SIGTERM else Stop.INTERRUPTED
            )
            if self.shared and self._leave(wait_for_busy=False) == "left":
                return RunResult(
                    self.store.get_run(self.run_id).state,
                    stop,
                    f"interrupted ({self.interrupted.name}): this worker recorded what it sent "
                    "and left the run to the other workers",
                    self.store.counts(self.run_id),
                )
            self._move_run(RunTrigger.PAUSE, stop_reason=f"interrupted ({self.interrupted.name})")
            return RunResult(
                RunState.PAUSED,
                stop,
                f"interrupted ({self.interrupted.name}): requests already sent were recorded; "
                "the run is paused",
                self.store.counts(self.run_id),
            )
        if self.shared:
            cancel_requested_at, state = self.store.run_signals(self.run_id)
            if state is not RunState.RUNNING:
                return self._moved_by_another(state)
        else:
            cancel_requested_at, version = self.store.run_flags(self.run_id)
            if version != self.lease_version:
                raise LeaseLost(f"run {self.run_id}: another process took over this run")
        if cancel_requested_at:
            if self.shared and self._leave(wait_for_busy=False) == "left":
                counts = self.store.counts(self.run_id)
                return RunResult(
                    RunState.CANCELLED,
                    Stop.CANCELLED,
                    "cancel requested: this worker stopped sending; the last worker (or "
                    f"`notifier cancel`) closes the run: {counts.summary()}",
                    counts,
                )
            return self.finish_cancel()
        return self._own_stop()

    def _own_stop(self) -> RunResult | None:
        """The endings this process found on its own, once nothing is in flight."""
        if self._halting is not None:
            # A sender saw an answer that halts the run, which the committer could not judge
            # as one (a failure while judging it): halt all the same.
            return self._halt(Stop.HALTED, self._halting)
        if self._rate_wake is not None:
            return self._pause_until(self._rate_wake, "the channel's --rate allows its next send")
        if self._approval_expired():
            when = self._approval_until
            reason = APPROVAL_PAUSE + (
                " was withdrawn or bound to other content"
                if when is None or when == _WITHDRAWN
                else f" expired at {clock.local(clock.iso(when))}"
            )
            return self._pause(
                Stop.APPROVAL_EXPIRED, reason, f"paused: {reason}; nothing more was sent"
            )
        return None

    def finish_cancel(self) -> RunResult:
        # Items waiting to retry after an uncertain attempt may have been delivered: settle
        # them by query, or make them unknown, before the run is closed.
        settle_doubts(self.store, self.run_id, self.channels, self.lease_version, say=self.p.say)
        self._move_run(RunTrigger.CANCEL, stop_reason=None)
        counts = self.store.counts(self.run_id)
        kinds = list(self.store.pending_kinds(self.run_id).values())
        return RunResult(
            RunState.CANCELLED,
            Stop.CANCELLED,
            "cancelled: "
            + counts.summary(counts.pending - len(kinds), kinds.count(PendingKind.RETRY_WAITING)),
            counts,
        )

    # ------------------------------------------------------------------ the pipeline

    def _expire_due(self) -> None:
        expired = self.store.expire_due(self.run_id, self.lease_version)
        if expired:
            self.p.advance(len(expired))
            shown = ", ".join(str(seq) for seq in expired[:10])
            more = f" and {len(expired) - 10} more" if len(expired) > 10 else ""
            self.p.say(f"expired (past not_after, never sent): item {shown}{more}")

    def _drop_stale(self, claimed: list[Item]) -> list[Item]:
        """The claimed items still within their deadline; the others are recorded as not sent
        (or unknown, see `_stale`) at once, never handed to a sender."""
        fresh, stale = self._stale(claimed)
        if stale:
            self.store.record(self.run_id, self.lease_version, stale)
            for outcome in stale:
                self._after(outcome)
        return fresh

    def _stale(self, window: list[Item]) -> tuple[list[Item], list[Outcome]]:
        """Claimed items whose deadline passed are not sent. One never possibly delivered
        goes back to pending, where the next expiry pass expires it; one that an earlier
        attempt may have reached becomes unknown, to be settled rather than expired blindly."""
        now = clock.now()
        fresh: list[Item] = []
        stale: list[Item] = []
        for item in window:
            (stale if _deadline_passed(item, now) else fresh).append(item)
        if not stale:
            return fresh, []
        # Any earlier attempt may have reached the recipient, not only the last (a 429 after
        # a 500 proves nothing about the 500's request); the open one was never started.
        doubtful = self.store.maybe_delivered(self.run_id, [item.seq for item in stale])
        outcomes: list[Outcome] = []
        for item in stale:
            uncertain = item.seq in doubtful
            outcomes.append(
                Outcome(
                    item.seq,
                    ItemTrigger.LOSE if uncertain else ItemTrigger.RETRY_LATER,
                    "expired",
                    error=(
                        f"not_after {item.not_after} passed after an attempt that may have "
                        "been delivered; not sent again: settle it with `notifier reconcile`"
                        if uncertain
                        else f"not_after {item.not_after} passed before its turn: not sent"
                    ),
                    expected=ItemState.IN_FLIGHT,
                )
            )
        return fresh, outcomes

    def _pipeline(self) -> RunResult:
        """Keep up to N sends in flight. Each turn takes the finished sends (waiting for one
        only when no slot is free or nothing more may start now), judges them, records their
        outcomes and claims replacements in ONE transaction, and only then hands the new
        items to the senders: no send starts before its point A is committed, and no outcome
        waits for more than the next commit."""
        size = self.options.concurrency
        # Items claimed ahead (point A committed) wait for a free sender, so a slot that
        # frees starts its next send at once instead of after the next commit's fsync;
        # N = 1 claims nothing ahead (the sequential protocol).
        capacity = size + self._ahead
        inflight: dict[int, Item] = {}
        starved = False  # the last claim found nothing more that may start now
        while True:
            draining = self.p.halt is not None or self._stopping()
            if not inflight and draining:
                # Every ending happens with nothing in flight, exactly as between two windows.
                if self.p.halt is not None:
                    return self._halt(*self.p.halt)
                stop = self._stop_requested()
                if stop is not None:
                    return stop
                continue
            self._revisit(idle=not inflight, stopping=draining)
            if self.p.halt is not None:
                # A revisit found a conflict: nothing new starts, and the sends still in
                # flight are collected below before the run halts (skipping the collection
                # here would leave them in flight forever, and this loop spinning).
                if not inflight:
                    continue
                draining = True
            if not inflight and starved:
                ended = self._when_starved()
                if ended is not None:
                    return ended
                starved = False
                continue
            wait = bool(inflight) and (len(inflight) >= capacity or starved or draining)
            done = self._senders.results(self._poll_timeout() if wait else None)
            for item, _ in done:
                del inflight[item.seq]
            if not draining and any(isinstance(slot[0], NotStarted) for _, slot in done):
                # A sender held an item back: a stop may have come while this thread waited
                # (a signal, a cancel), and what it gave back must not be claimed again.
                draining = self._stopping()
            free = capacity - len(inflight)
            if draining or (size == 1 and done):
                # N = 1 is the sequential protocol to the letter: point B of an item is its
                # own commit, before the next item's point A.
                free = 0
            busy = Counter(item.channel for item in inflight.values())
            claimed = self._commit(done, free, busy, stopping=draining)
            starved = free > 0 and len(claimed) < free
            for item in self._drop_stale(claimed):
                inflight[item.seq] = item
                self._senders.submit(item)

    def _when_starved(self) -> RunResult | None:
        """Nothing in flight and nothing could be claimed: finish, pause until a long wait
        is over, or sleep until the next item may start (None: go on)."""
        wake = self._next_wake()
        if wake is None:
            finished = self._finish()
            if finished is None:  # other workers of a shared run are still at work
                self._sleep_until(time.monotonic() + POLL_S)
            return finished
        if wake - time.monotonic() > self.options.max_wait_s:
            return self._pause_until(wake)
        self._sleep_until(wake)
        return None

    def _commit(
        self, done: list[tuple[Item, Slot]], free: int, busy: Counter[str], *, stopping: bool
    ) -> list[Item]:
        """Point B of the finished sends and point A of up to `free` new items, one commit.
        `busy`: items still in flight, per channel. `stopping`: the run is ending, so
        a maybe-delivered item is left to be asked about later rather than queried now."""
        seqs = [item.seq for item, _ in done]
        if self.crash and seqs:
            self.crash.at("after-send", seqs)

        def may_ask() -> bool:
            """No query while the run is ending: asked before each, as a stop may come
            while this commit's earlier answers are being judged."""
            return not (stopping or self._ending())

        outcomes = [
            replace(
                self.judge.safely(item, result, at, mono, may_ask=may_ask),
                expected=ItemState.IN_FLIGHT,
                finished_at=clock.iso(at),
                started_at=None if started is None else clock.iso(started),
            )
            for item, (result, at, mono, started) in done
            if result is not None
        ]
        held_back = [item.seq for item, (result, *_) in done if result is None]
        doubted_here = sum(1 for item, (result, *_) in done if self._doubts(item, result))
        channel_of = {item.seq: item.channel for item, _ in done}
        if held_back or self._would_halt(outcomes, channel_of):
            free = 0  # nothing new starts in a run about to stop
        # A capped channel gets new items only while under its cap, and no more than the
        # room left: while one has room, a commit claims at most that many items.
        full = {name for name, cap in self._caps.items() if busy[name] >= cap}
        exclude = sorted({*self._closed_gates(), *full})
        room = [cap - busy[name] for name, cap in self._caps.items() if name not in exclude]
        free = min([free, *room])
        claimed = self.store.step(
            self.run_id,
            self.lease_version,
            outcomes,
            free,
            exclude_channels=exclude,
            exclude_seqs=self._held(),
        )
        if held_back:
            # Not sent, not recorded: left in flight for whoever holds the run to settle by
            # query (nothing left, so it is sent then, once, with the same key).
            raise LeaseLost(
                f"run {self.run_id}: this worker could not prove it still held the run (its "
                f"lease was last renewed too long ago or was taken over), so item(s) "
                f"{', '.join(map(str, held_back))} were not sent; `notifier resume "
                f"{self.run_id}` settles them"
            )
        if claimed:
            # Read after this commit, before its items go to the senders: an item claimed
            # after a cancel was committed never starts.
            self._read_flags()
        if self.crash and seqs:
            self.crash.at("after-receipt", seqs)
        self.observer.recorded(done, outcomes)
        for outcome in outcomes:
            self._after(outcome)
            self._note_reach(channel_of[outcome.seq], outcome)
        if doubted_here:
            # These doubted answers are judged now: the committer's streak holds them from
            # here on (see _may_start). Only these: others may still wait to be judged.
            with self._doubted_lock:
                self._doubted = max(0, self._doubted - doubted_here)
        if self.crash and claimed:
            self.crash.at("after-intent", [item.seq for item in claimed])
        return claimed

    def _revisit(self, *, idle: bool, stopping: bool) -> None:
        """`_settle_waiting` whenever nothing is in flight, else at most every POLL_S: a
        stream of sends must not postpone the query_delay revisits, nor pay a query each.
        None while the run is stopping: the items waiting to be asked about stay unknown for
        whoever settles the run next, rather than hold the stop up by their queries."""
        if idle or time.monotonic() >= self._revisit_at:
            if not stopping:
                self._settle_waiting()
            self._expire_due()
            if self._approval_until is not None:
                self._read_approval()
            if self.shared:
                # Gates closed by other workers' throttled answers count here too.
                for channel, until in self.store.channel_gates(self.run_id).items():
                    self.p.gate(channel, time.monotonic() + _seconds_until(clock.parse(until)))
            self._revisit_at = time.monotonic() + POLL_S
        if self.shared and time.monotonic() >= self._reap_at:
            self._adopt_and_settle()
            self._reap_at = time.monotonic() + REAP_S

    def _ending(self) -> bool:
        """Whether the run is ending: a signal, a halt, an expired approval or a cancel (the
        flag read now: one query, cheaper than the downstream query it may spare)."""
        return (
            self.interrupted.is_set()
            or self._halting is not None
            or self.p.halt is not None
            or self._approval_expired()
            or self._cancel_read_now()
        )

    def _cancel_read_now(self) -> bool:
        """The cancel flag as the database holds it now, published to the senders too: a
        cancel seen here stops them before the committer's next turn."""
        cancel = self.store.run_flags(self.run_id)[0]
        if cancel is not None:
            self._cancel_seen = cancel
        return cancel is not None

    def _stopping(self) -> bool:
        """Whether to stop starting sends (Ctrl-C, a cancel); the ending itself waits until
        nothing is in flight. A lost lease ends at once: nothing more can be recorded."""
        if self.lease_lost.is_set():
            raise LeaseLost(f"run {self.run_id}: another process took over this run")
        # The flags are read even when already stopping: a cancel that comes during a rate
        # pause or a drain must still reach the senders holding claimed items.
        moved = self._read_flags()
        return (
            moved
            or self.interrupted.is_set()
            or self._halting is not None
            or self._approval_expired()
            or self._rate_wake is not None
        )

    def _read_flags(self) -> bool:
        """Read the run's flags on this thread's connection and publish its cancel request
        to the senders (`_cancel_seen`). Whether the run stops starting sends: a cancel, or
        on a shared run another worker halted, paused or closed it."""
        if self.shared:
            cancel, state = self.store.run_signals(self.run_id)
            moved = state is not RunState.RUNNING
        else:
            cancel, version = self.store.run_flags(self.run_id)
            if version != self.lease_version:
                raise LeaseLost(f"run {self.run_id}: another process took over this run")
            moved = False
        self._cancel_seen = cancel
        return cancel is not None or moved

    def _would_halt(self, outcomes: list[Outcome], channel_of: Mapping[int, str]) -> bool:
        """Whether recording `outcomes` halts or pauses the run (`_after`'s and
        `_note_reach`'s rules, read ahead)."""
        if self.p.halt is not None:
            return True
        streak = self.p.unknown_streak
        unreached = dict(self.p.unreached)
        for outcome in outcomes:
            if outcome.trigger == ItemTrigger.CONFLICT:
                return True
            streak = _next_streak(streak, outcome)
            if streak >= self.options.unknown_streak_limit:
                return True
            channel = channel_of[outcome.seq]
            unreached[channel] = _unreached_after(unreached.get(channel, 0), outcome)
            if unreached[channel] >= self.policy.down_after:
                return True
        return False

    def _note_reach(self, channel: str, outcome: Outcome) -> None:
        """A channel whose requests keep failing to reach its receiver (refused, DNS, TLS)
        is down: the run pauses, its items pending, none failed for it."""
        count = _unreached_after(self.p.unreached.get(channel, 0), outcome)
        self.p.unreached[channel] = count
        if count >= self.policy.down_after and self.p.halt is None:
            self.p.halt = (
                Stop.CHANNEL_DOWN,
                f"channel {channel!r}{CHANNEL_DOWN_PAUSE}{count} requests in a row could not "
                f"reach its receiver ({outcome.error})",
            )

    def _poll_timeout(self) -> float:
        """How long to wait for a finished send: until a gate or hold may open, at most
        POLL_S (so a cancel or Ctrl-C is seen soon)."""
        now = time.monotonic()
        gates = self.p.closed_gates(now).values()
        opens = [t for t in (*gates, *self.p.holds.values()) if t > now]
        return max(0.001, min([POLL_S, *(t - now for t in opens)]))

    def _may_start(self) -> str | None:
        """Why the next send must not start now, or None. Called inside the channel lock right
        before the send, so an item queued behind a slow request is checked at the moment it
        would start, not when it was claimed; also while waiting for a --rate token. Ctrl-C
        stops every send not yet started, like a cancel: the requests already under way
        finish and are recorded, nothing else leaves."""
        if self.interrupted.is_set():
            return f"interrupted ({self.interrupted.name}) before it started"
        halting = self._halting or (self.p.halt[1] if self.p.halt is not None else None)
        if halting is not None:
            return f"the run is halting ({halting}) before it started"
        # Uncertain answers in a row: those judged (the committer's streak) plus those the
        # senders saw and the committer has not judged yet.
        doubted = self._doubted + self.p.unknown_streak
        if doubted >= self.options.unknown_streak_limit:
            return f"{doubted} uncertain answers in a row are being judged"
        if self._approval_expired():
            return "the run's approval expired before it started"
        if self._cancel_seen is not None:
            return f"cancel requested at {self._cancel_seen}"
        return None

    def _send_stopped(self) -> bool:
        """Stop waiting for a --rate token: the lease is lost, or the send may not start. At
        N = 1 the wait is on the committer's own thread, whose turn it holds up: the flags
        are read here then (at most every POLL_S), or a cancel would go unseen for the whole
        wait."""
        if self.options.concurrency == 1 and time.monotonic() >= self._flags_due:
            self._flags_due = time.monotonic() + POLL_S
            try:
                if self._read_flags():
                    return True
            except LeaseLost:
                self.lease_lost.set()
        return self.lease_lost.is_set() or self._may_start() is not None

    def _send_one(self, item: Item) -> Slot:
        """The result and the moment it arrived, on the wall clock (to record) and on the
        monotonic clock (to wait): waits (Retry-After) count from then. None: not sent at
        all, because this worker can no longer prove the run is its own."""
        result: Sent
        started: datetime | None = None
        try:
            with self._locks.get(item.channel) or nullcontext():
                bucket = self._buckets.get(item.channel)
                asked = time.monotonic()
                wait = (
                    None
                    if bucket is None
                    else bucket.take(self._send_stopped, self.options.max_wait_s)
                )
                if bucket is not None:
                    self.observer.rate_waited(item.channel, time.monotonic() - asked)
                # Both checks at the moment the request would start, after any wait for the
                # channel's lock or a --rate token: the lease is still surely ours, and no
                # cancel was seen.
                if not self._lease_allows_send():
                    return None, clock.now(), time.monotonic(), None
                reason = self._may_start() or self._gated(item) or _past_deadline(item)
                if reason is None and wait is not None:
                    if wait > self.options.max_wait_s:
                        # The run pauses until then, rather than wait past --max-wait.
                        self._rate_wake = time.monotonic() + wait
                    reason = f"waiting for the channel's --rate ({wait:.1f}s to the next send)"
                if reason is not None:
                    return NotStarted(reason), clock.now(), time.monotonic(), None
                # The attempt's real start: an item claimed ahead waited in the queue
                # since its claim, which opened the attempt (see Outcome.started_at).
                started = clock.now()
                self.observer.attempt_started(item)
                result = self.channels[item.channel].send(item.intent())
        except ChannelError as exc:
            result = exc
        except Exception as exc:  # a channel bug: the request may have left, so be careful
            result = ChannelError(ErrorKind.UNCERTAIN, f"unexpected {type(exc).__name__}: {exc}")
        mono = time.monotonic()
        self.observer.answered(item, result, started)
        with suppress(Exception):  # a warning only: the committer judges the answer in full
            self._warn_senders(item, result, mono)
        return result, clock.now(), mono, started

    def _warn_senders(self, item: Item, result: Receipt | ChannelError, mono: float) -> None:
        """What every other sender must know the moment this answer arrives, not after the
        committer's next gather and commit (the committer judges it again, in full): a
        throttled answer closes its channel's gate, and an answer that halts the run (410,
        422, a receipt for another digest) stops every send not yet started."""
        if isinstance(result, Receipt):
            if result.intent_digest and result.intent_digest != item.intent_digest:
                self._halting = f"conflict on item {item.seq}"
            with self._doubted_lock:
                self._doubted = 0
            return
        if self._doubts(item, result):
            with self._doubted_lock:
                self._doubted += 1
        if result.kind in (ErrorKind.GONE, ErrorKind.CONFLICT):
            self._halting = f"{result.kind.value} answer for item {item.seq}"
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

    def _doubts(self, item: Item, result: Sent | None) -> bool:
        """An answer that counts toward the uncertain-answers brake: maybe delivered, on a
        channel that cannot dedupe a second request."""
        return (
            isinstance(result, ChannelError)
            and result.kind is ErrorKind.UNCERTAIN
            and not self.channels[item.channel].idempotent
        )

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
        if self.lease_lost.is_set() or not self.lease_valid():
            self.lease_lost.set()
            return False
        return True

    def _after(self, outcome: Outcome) -> None:
        if outcome.trigger == ItemTrigger.LOSE and outcome.next_attempt_at is not None:
            # Waiting for query_delay: not an unknown outcome (yet), so no streak, no advance.
            self.p.say(f"item {outcome.seq}: {outcome.error}")
            return
        if outcome.trigger in (
            ItemTrigger.ACK,
            ItemTrigger.FOUND,
            ItemTrigger.GIVE_UP,
            ItemTrigger.CONFLICT,
            ItemTrigger.LOSE,
        ):
            self.p.advance(1)
        self.p.unknown_streak = _next_streak(self.p.unknown_streak, outcome)
        if outcome.trigger == ItemTrigger.LOSE:
            self.p.say(f"item {outcome.seq}: unknown — {outcome.error}")
            if self.p.unknown_streak >= self.options.unknown_streak_limit and self.p.halt is None:
                self.p.halt = (
                    Stop.HALTED,
                    f"{self.p.unknown_streak} unknown outcomes in a row: check the downstream",
                )
        elif outcome.trigger in (ItemTrigger.GIVE_UP, ItemTrigger.CONFLICT):
            self.p.say(f"item {outcome.seq}: failed — {outcome.error}")
        if outcome.trigger == ItemTrigger.CONFLICT:
            # Whatever revealed it (a 422, a query, a receipt for another digest), a key held
            # by another intent means something else writes under our keys: stop, exit 4.
            self.p.halt = (Stop.CONFLICT, f"conflict on item {outcome.seq}: {outcome.error}")

    # ------------------------------------------------------------------ waiting

    def _closed_gates(self) -> list[str]:
        now = time.monotonic()
        return list(self.p.closed_gates(now))

    def _held(self) -> list[int]:
        """Items still waiting out a backoff given in this process (expired holds dropped)."""
        now = time.monotonic()
        self.p.holds = {seq: until for seq, until in self.p.holds.items() if until > now}
        return list(self.p.holds)

    def _next_wake(self) -> float | None:
        """The monotonic time when the next pending item may start: its own next_attempt_at,
        but no earlier than its channel's gate or its in-process hold. None when nothing is
        pending."""
        now = time.monotonic()
        wakes = []
        for channel, earliest in self.store.pending_by_channel(self.run_id):
            # A stored time is wall-clock (from an earlier process or this one): converted.
            wake = now + (_seconds_until(clock.parse(earliest)) if earliest else 0.0)
            wakes.append(max(wake, self.p.gates.get(channel, wake)))
        # An item waiting for its query_delay keeps the run open until it is asked again.
        wakes.extend(
            now + _seconds_until(clock.parse(item.next_attempt_at))
            for item in self.store.waiting_for_query(self.run_id)
            if item.next_attempt_at is not None
        )
        if not wakes:
            return None
        if min(wakes) <= now:
            # Something looks due by the wall clock, yet nothing could be claimed: those items
            # are held by a backoff given in this process (the wall clock may have jumped).
            later = [w for w in wakes if w > now] + [h for h in self.p.holds.values() if h > now]
            return min(later, default=now)
        return min(wakes)

    def _sleep_until(self, wake: float) -> None:
        while (remaining := wake - time.monotonic()) > 0:
            if self.interrupted.is_set() or self.lease_lost.is_set():
                return
            if self.store.run_flags(self.run_id)[0]:
                return  # cancel requested: the main loop finishes the run
            time.sleep(min(remaining, POLL_S))

    # ------------------------------------------------------------------ endings

    def _pause_until(self, wake: float, cause: str = "the downstream asked to wait") -> RunResult:
        # Persisted for the next process, so as wall-clock time.
        when = clock.iso(clock.later(wake - time.monotonic()))
        reason = f"rate limited until {when} (longer than --max-wait {self.options.max_wait_s:g}s)"
        said = f"paused: {cause} until {clock.local(when)}"
        return self._pause(Stop.RATE_LIMITED, reason, said, paused_until=when)

    def _pause(
        self, stop: Stop, reason: str, said: str, *, paused_until: str | None = None
    ) -> RunResult:
        """Pause the run for `reason` (stored, for `status` and the other workers); if
        another worker moved it first, end as that move says."""
        sets = {"stop_reason": reason} | ({"paused_until": paused_until} if paused_until else {})
        moved = self._move_run(RunTrigger.PAUSE, **sets)
        if moved is not RunState.PAUSED:
            return self._moved_by_another(moved)
        counts = self.store.counts(self.run_id)
        return RunResult(RunState.PAUSED, stop, said, counts, paused_until=paused_until)

    def _halt(self, stop: Stop, reason: str) -> RunResult:
        """End the run for a safety rule: halted; or, for a channel that is down (nothing
        is wrong with its items), paused, so that `resume` goes on once it is back."""
        if stop is Stop.CHANNEL_DOWN:
            return self._pause(stop, reason, f"paused: {reason}")
        moved = self._move_run(RunTrigger.HALT, stop_reason=reason)
        if moved is not RunState.HALTED:
            return self._moved_by_another(moved)
        return RunResult(RunState.HALTED, stop, f"halted: {reason}", self.store.counts(self.run_id))

    def _finish(self) -> RunResult | None:
        """Close the run: nothing is left to send. None on a shared run while other workers
        still hold items (this one waits for them, or for their leases to die)."""
        if self.shared:
            ending = self._leave(wait_for_busy=True)
            if ending == "wait":
                return None
            if ending == "left":
                return self._left("nothing left for this worker; the other workers finish the run")
            if self._adopt_and_settle():
                return None  # settled what a dead worker left: look again before closing
        counts = self.store.counts(self.run_id)
        if self.shared and counts.in_flight:
            return None  # held by a worker not yet known dead: wait for it
        summary = counts.summary()
        if counts.unknown:
            reason = f"{counts.unknown} item(s) with unknown outcome"
            moved = self._move_run(RunTrigger.PAUSE, stop_reason=reason)
            if moved is not RunState.PAUSED:
                return self._moved_by_another(moved)
            return RunResult(RunState.PAUSED, Stop.UNKNOWN_LEFT, summary, counts)
        moved = self._move_run(RunTrigger.COMPLETE)
        if moved is not RunState.COMPLETED:
            return self._moved_by_another(moved)
        return RunResult(RunState.COMPLETED, Stop.COMPLETED, f"completed: {summary}", counts)

    # ------------------------------------------------------------------ shared runs

    def _move_run(self, trigger: RunTrigger, **sets: str | None) -> RunState:
        """Move the run; on a shared run only from `running` (another worker may have moved
        it first: then its state is returned, unchanged)."""
        if self.shared:
            return self.store.move_run_from(
                self.run_id, trigger, self.lease_version, (RunState.RUNNING,), **sets
            )
        return self.store.move_run(self.run_id, trigger, self.lease_version, **sets)

    def _adopt_and_settle(self) -> bool:
        """Fence out dead workers, adopt what they left in flight (and unknown items no live
        worker holds) and settle it by query, before this worker sends anything more.
        Whether anything was adopted."""
        adopted = self.store.reap_dead_workers(
            self.run_id, self.store.worker_id or "", self.lease_version, holder_alive
        )
        if not adopted:
            return False
        self.p.say(f"settling {len(adopted)} item(s) left by a worker that died")
        items = [self.store.item(self.run_id, seq) for seq in adopted]
        for s in settle_items(
            self.store, self.run_id, self.channels, self.lease_version, items, self.p.say
        ):
            if s.outcome is not None and s.outcome.trigger == ItemTrigger.CONFLICT:
                self.p.halt = (Stop.CONFLICT, f"conflict on item {s.item.seq}: {s.outcome.error}")
        return True

    def _leave(self, *, wait_for_busy: bool) -> str:
        return self.store.leave_unless_last(
            self.run_id,
            self.store.worker_id or "",
            self.lease_version,
            holder_alive,
            wait_for_busy=wait_for_busy,
        )

    def _left(self, reason: str) -> RunResult:
        counts = self.store.counts(self.run_id)
        return RunResult(self.store.get_run(self.run_id).state, Stop.LEFT, reason, counts)

    def _moved_by_another(self, state: RunState) -> RunResult:
        """This worker's ending when another worker (or a cancel) moved the run first."""
        run = self.store.get_run(self.run_id)
        counts = self.store.counts(self.run_id)
        reason = f"{state.value} by another worker: {run.stop_reason or counts.summary()}"
        stop = {
            RunState.COMPLETED: Stop.COMPLETED,
            RunState.CANCELLED: Stop.CANCELLED,
            RunState.HALTED: Stop.HALTED,
        }.get(state)
        if stop is None:  # paused: why, as the worker that paused it wrote it
            why = run.stop_reason or ""
            if run.paused_until:
                stop = Stop.RATE_LIMITED
            elif why.startswith(APPROVAL_PAUSE):
                stop = Stop.APPROVAL_EXPIRED
            elif CHANNEL_DOWN_PAUSE in why:
                stop = Stop.CHANNEL_DOWN
            elif why.startswith("interrupted"):
                stop = Stop.LEFT
            else:
                stop = Stop.UNKNOWN_LEFT
        return RunResult(state, stop, reason, counts, paused_until=run.paused_until)

    def _bucket(self, channel: str, rate: float) -> TokenBucket | SharedBucket:
        """A channel's --rate bucket: this process's own, or on a shared run one kept in the
        database for all its workers (so ten workers do not send ten times the rate)."""
        if not self.shared:
            return TokenBucket(rate)
        if self._bucket_store is None:
            concurrent = self.options.concurrency > 1
            self._bucket_store = self.store.secondary() if concurrent else self.store
        return SharedBucket(self._bucket_store, self._bucket_lock, self.run_id, channel, rate)


def _unreached_after(count: int, outcome: Outcome) -> int:
    """Requests of a channel in a row that could not reach its receiver, after `outcome`
    (one of that channel's): a request given back as not_sent counts, one never started
    changes nothing, any answer from the receiver starts again from zero."""
    if outcome.trigger == ItemTrigger.RELEASE:
        return count + (outcome.attempt_outcome == ErrorKind.NOT_SENT.value)
    return 0


def _next_streak(streak: int, outcome: Outcome) -> int:
    """Unknown outcomes in a row after `outcome` (a query_delay wait is not one)."""
    if outcome.trigger in (ItemTrigger.ACK, ItemTrigger.FOUND):
        return 0
    if outcome.trigger == ItemTrigger.LOSE and outcome.next_attempt_at is None:
        return streak + 1
    return streak


def _past_deadline(item: Item) -> str | None:
    """An item claimed before its not_after may wait past it for a free sender (or the
    channel's lock, or a --rate token): then it does not start. Released, never attempted,
    it is expired by the next pass, or settled if an earlier attempt may have reached the
    recipient."""
    if _deadline_passed(item, clock.now()):
        return f"not_after {item.not_after} passed before it started"
    return None


def _deadline_passed(item: Item, now: datetime) -> bool:
    """Whether the item's not_after (if it has one) is over at `now`: checked when it is
    claimed (`_stale`) and again right before its send (`_past_deadline`)."""
    return item.not_after is not None and clock.parse(item.not_after) <= now


def _seconds_until(moment: datetime) -> float:
    """Seconds from now (wall clock) to `moment`; 0 when it has passed."""
    return max(0.0, (moment - clock.now()).total_seconds())
