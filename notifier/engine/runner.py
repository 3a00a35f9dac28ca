"""The send loop: settle what was in flight, then a continuous pipeline of
point A (intents + attempts durable) → send → point B (outcomes durable).

Up to N sends are in flight at once on N sender threads (pipeline.py); this thread is the
only one that writes, and each of its transactions records the outcomes that came back and
claims their replacements together (a group commit). Mid-run it never asks a channel
anything: the status queries are asked by the senders (after an uncertain answer) and by a
question pool of their own (at a revisit, for a dead worker's items), at most
max(1, N // 2) at once, and it records what they found. N = 1 sends (and asks) in
this thread: the strict sequential protocol.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace

from notifier.channels import Channel
from notifier.content import schedule
from notifier.domain import clock
from notifier.domain.decide import Unasked
from notifier.domain.records import Item, Outcome, Run
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import (
    FINISHED_RUN_STATES,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
)
from notifier.engine import wakes
from notifier.engine.brakes import CHANNEL_DOWN_PAUSE, Brakes, conflict
from notifier.engine.coordination import RunOptions, RunResult, for_run
from notifier.engine.crash import CrashPlan
from notifier.engine.deadlines import split_stale
from notifier.engine.domain_rates import DomainRates
from notifier.engine.judging import Judge, NotStarted, Progress, SendResult
from notifier.engine.pipeline import GATHER_PER_N_AHEAD_S, POLL_S, Senders, claim_ahead
from notifier.engine.run_control import Brake, RunControl, Stop, StopRequest
from notifier.engine.sending import Asked, Dispatch, is_put_off
from notifier.engine.settle_by_query import Question, Settlement, decided, question
from notifier.observe import NULL_OBSERVER, Observer
from notifier.ops import approval
from notifier.store import LeaseLost, Store

# A revisit's finding that settles its item for the progress shown.
_COUNTED = (ItemTrigger.FOUND, ItemTrigger.UNDECIDED, ItemTrigger.GIVE_UP)
# Kept here for the callers that know them from the runner.
APPROVAL_PAUSE = approval.APPROVAL_PAUSE
__all__ = ["APPROVAL_PAUSE", "CHANNEL_DOWN_PAUSE", "RunOptions", "RunResult", "Runner"]


class Runner:
    """Sends one run from this process: the committer's loop, and the run's endings."""

    def __init__(
        self,
        store: Store,
        run: Run,
        channels: Mapping[str, Channel],
        policy: RetryPolicy,
        options: RunOptions,
        *,
        lease_version: int,
        control: RunControl,
        crash: CrashPlan | None = None,
        say: Callable[[str], None] = print,
        advance: Callable[[int], None] = lambda n: None,
        lease_valid: Callable[[], bool] = lambda: True,
        channel_rates: Mapping[str, float | None] | None = None,
        observer: Observer = NULL_OBSERVER,
    ) -> None:
        self.store = store
        # The run as read once this process held its lease: nothing before the first send
        # reads its row again (its state decides the start, its snapshot the domains).
        self.record = run
        self.run_id = run_id = run.run_id
        self.channels = channels
        self.policy = policy
        self.options = options
        self.lease_version = lease_version
        # The one holder of whether to stop (run_control.py): a signal, the lease, a brake,
        # a cancel or another worker's move each ask it; every check here reads it.
        self.control = control
        self.crash = crash
        self.observer = observer  # metrics and JSON logs (notifier/observe); a no-op without
        self.p = Progress(
            say,
            advance,
            on_gate=observer.gated,
            on_settled=None
            if observer is NULL_OBSERVER  # nothing read for an observer that is not there
            else lambda item, outcome: observer.recorded([(item, None)], [outcome]),
        )
        self.judge = Judge(store, run_id, channels, policy, self.p, control)
        self.brakes = Brakes(
            self.p, streak_limit=options.unknown_streak_limit, down_after=policy.down_after
        )
        # How this process shares the run: alone, or with other workers (coordination.py).
        self.coord = for_run(store, run_id, channels, lease_version, self.p, options, control)
        self.approval = approval.Watch(control)
        # One token bucket per rate-limited channel, shared by all its senders: --rate for
        # the run, else the channel's own `rate`.
        rates = channel_rates or {}
        buckets = {
            name: self.coord.bucket(name, rate)
            for name in channels
            if (rate := options.rate or rates.get(name))
        }
        self.dispatch = Dispatch(
            channels,
            policy,
            options,
            self.p,
            control=control,
            lease_valid=lease_valid,
            read_flags=self._read_flags,
            listed=lambda item: bool(self.store.suppressions.among([item])),
            observer=observer,
            buckets=buckets,
            domains=DomainRates(run.channel_snapshot, self.coord.bucket),
        )
        # Items claimed ahead of the N being sent, point A committed (see claim_ahead).
        self._ahead = claim_ahead(options.concurrency, channels.values())
        self._senders: Senders[Item | Question, SendResult | Asked] = Senders(
            options.concurrency,
            self.dispatch.work,
            gather_s=GATHER_PER_N_AHEAD_S * self._ahead / options.concurrency,
        )
        # The committer's questions (revisits, adopted items) have threads of their own, one
        # per query slot: one waiting for a gate or a slow status endpoint holds up no send.
        self._askers: Senders[Item | Question, SendResult | Asked] = Senders(
            self.dispatch.query_slots,
            self.dispatch.work,
            done=self._senders.done,
            threaded=options.concurrency > 1,
            name="ask",
        )
        self._revisit_at = 0.0  # when to look again for query_delay revisits that came due

    # ------------------------------------------------------------------ top level

    def run(self) -> RunResult:
        try:
            with self.control.marking():  # a loss this thread finds, before all else
                return self._run()
        except LeaseLost as lost:
            self.observer.ended(self.coord.lost(lost))  # the ending event any other end logs
            raise
        finally:
            # Whatever ended the committer (a storage failure included), a sender that has
            # taken an item starts no request nobody would record.
            self.control.request(Stop.HALTED, "the worker is stopping", provisional=True)
            self._senders.close()
            self._askers.close()
            self.coord.close()

    def _run(self) -> RunResult:
        run = self.record
        if run.state in FINISHED_RUN_STATES:
            # A `cancel` (or another process) finished the run between our plan or read and
            # our lease: there is nothing to send, and no move is legal any more.
            return RunResult(
                run.state,
                Stop.ALREADY_FINISHED,
                f"already {run.state.value}; nothing was sent by this process",
                self.store.queries.counts(self.run_id),
            )
        state = self.coord.start(run)
        if state is not RunState.RUNNING:
            return self.coord.moved_by_another(state)
        self.approval.read(run)
        # Gates an earlier process was given: its wall-clock time, converted once.
        for channel, until in self.store.queries.throttled_until(self.run_id).items():
            self.p.gate(channel, time.monotonic() + clock.seconds_until(clock.parse(until)))
        # Nothing new starts until every item whose outcome is open has been settled (a
        # conflict found halts the run: the pipeline's first turn ends it).
        self.coord.settle_open()
        return self._pipeline()

    def _ending(self) -> RunResult | None:
        """Once nothing is in flight: end as the strongest stop in force says (the run
        control's `ending`), or None to go on (an approval renewed meanwhile). The run's
        flags are read once more first: a cancel that came during the drain counts."""
        self._read_flags()
        stop = self.control.ending(clock.now())
        if stop is None:
            return None
        if stop.cause is Stop.LEASE_LOST:
            raise self.control.lost_error(self.run_id)
        if stop.cause in (Stop.HALTED, Stop.CONFLICT, Stop.CHANNEL_DOWN):
            # A sender's reading of an answer the committer could not judge as halting (a
            # failure while judging it) halts all the same.
            return self.coord.halt(stop.cause, stop.detail)
        if stop.cause in (Stop.INTERRUPTED, Stop.TERMINATED):
            return self._interrupted(stop)
        if stop.cause is Stop.MOVED:
            assert stop.moved_to is not None  # a move is requested with its state
            return self.coord.moved_by_another(stop.moved_to)
        if stop.cause is Stop.CANCELLED:
            if self.coord.leave(wait_for_busy=False) == "left":
                counts = self.store.queries.counts(self.run_id)
                return RunResult(
                    RunState.CANCELLED,
                    Stop.CANCELLED,
                    "cancel requested: this worker stopped sending; the last worker (or "
                    f"the cancel) closes the run: {counts.summary()}",
                    counts,
                )
            return self.coord.finish_cancel()
        if stop.cause is Stop.RATE_LIMITED:
            assert stop.until is not None  # a --rate pause is requested with its end
            return self._pause_until(stop.until, stop.detail)
        said = f"paused: {stop.detail}; nothing more was sent"  # the approval expired
        return self.coord.pause(Stop.APPROVAL_EXPIRED, stop.detail, said)

    def _interrupted(self, stop: StopRequest) -> RunResult:
        """Ctrl-C or SIGTERM: pause the run (or, a worker of a shared run, leave it to the
        others), with what was sent recorded."""
        name = stop.detail  # the signal, as people know it
        if self.coord.leave(wait_for_busy=False) == "left":
            return self.coord.left(
                stop.cause,
                f"interrupted ({name}): this worker recorded what it sent "
                "and left the run to the other workers",
            )
        self.coord.stop(RunTrigger.PAUSE, stop.cause, f"interrupted ({name})")
        return RunResult(
            RunState.PAUSED,
            stop.cause,
            f"interrupted ({name}): requests already sent were recorded; the run is paused",
            self.store.queries.counts(self.run_id),
        )

    # ------------------------------------------------------------------ the pipeline

    def _expire_due(self) -> None:
        expired = self.store.ledger.expire_due(self.run_id, self.lease_version)
        if expired:
            if self.p.on_settled is not None:  # each item read only for an observer
                error = "past its not_after before its turn; never sent"
                for seq in expired:
                    item = self.store.queries.item(self.run_id, seq)
                    self.p.settled(item, Outcome(seq, ItemTrigger.EXPIRE, error=error))
            self.p.advance(len(expired))
            shown = ", ".join(str(seq) for seq in expired[:10])
            more = f" and {len(expired) - 10} more" if len(expired) > 10 else ""
            self.p.say(f"expired (past not_after, never sent): item {shown}{more}")

    def _drop_stale(self, claimed: list[Item]) -> list[Item]:
        """The claimed items still within their deadline; the others are recorded as not sent
        (or unknown, see deadlines.split_stale) at once, never handed to a sender."""
        fresh, stale = split_stale(self.store, self.run_id, claimed, self.channels)
        if stale:
            self.store.ledger.record(self.run_id, self.lease_version, stale)
            self.observer.recorded([(item, None) for item in claimed], stale)
            for outcome in stale:
                self._brake(self.brakes.after(outcome))
        return fresh

    def _brake(self, brake: Brake | None) -> None:
        """A brake the rules set off stops the run: asked of the run control."""
        if brake is not None:
            self.control.request(*brake)

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
            draining = self._stopping()
            if not inflight and draining:
                # Every ending happens with nothing in flight, exactly as between two windows.
                stop = self._ending()
                if stop is not None:
                    return stop
                continue
            self._revisit(inflight, stopping=draining)
            if not inflight and starved:
                ended = self._when_starved()
                if ended is not None:
                    return ended
                starved = False
                continue
            # While the senders' brake holds every send back (uncertain answers whose status
            # queries are under way on their senders), wait for those answers: an item
            # claimed now is only released unstarted, and claimed again, over and over.
            braked = bool(inflight) and self.dispatch.braked()
            wait = bool(inflight) and (len(inflight) >= capacity or starved or draining or braked)
            done = self._senders.results(wakes.poll_timeout(self.p) if wait else None)
            for job, _ in done:
                del inflight[job.seq]
            sent = [
                (job, r) for job, r in done if isinstance(job, Item) and not isinstance(r, Asked)
            ]
            for item, slot in [(i, r) for i, r in sent if is_put_off(r)]:
                inflight[item.seq] = item  # unjudged until the question pool has asked
                self.dispatch.put_off[item.seq] = slot
                self._askers.submit(item)
            sent = [(item, r) for item, r in sent if not is_put_off(r)]
            asked = [r for _, r in done if isinstance(r, Asked)]
            if not draining and any(isinstance(slot.result, NotStarted) for _, slot in sent):
                # A sender held an item back: a stop may have come while this thread waited
                # (a signal, a cancel), and what it gave back must not be claimed again.
                draining = self._stopping()
            free = capacity - len(inflight)
            if draining or braked or (size == 1 and done):
                # N = 1 is the sequential protocol to the letter: point B of an item is its
                # own commit, before the next item's point A.
                free = 0
            busy = Counter(item.channel for item in inflight.values())
            claimed = self._commit(sent, asked, free, busy)
            starved = free > 0 and len(claimed) < free
            for item in self._drop_stale(claimed):
                inflight[item.seq] = item
                self._hand_out(item)

    def _hand_out(self, item: Item) -> None:
        """To a sender. A retry's earlier attempts go with it, read here, where the store
        is (a sender has no connection): whether an uncertain answer needs a status query
        rests on them (the policy's deadline)."""
        if item.attempts > 1:
            self.dispatch.histories[item.seq] = self.judge.history_of(item)
        self._senders.submit(item)

    def _when_starved(self) -> RunResult | None:
        """Nothing in flight and nothing could be claimed: finish, pause until a long wait
        is over, or sleep until the next item may start or pass its deadline (None: go on)."""
        wake = wakes.next_wake(self.store.queries, self.run_id, self.p)
        if wake is None:
            finished = self.coord.finish()
            if finished is None:  # other workers of a shared run are still at work
                self._sleep_until(time.monotonic() + POLL_S)
            return finished
        # An item whose deadline comes before it may be sent is expired then, not when the
        # run next wakes to send: the deadline is a wake of its own, within --max-wait.
        deadline = wakes.next_deadline(self.store.queries, self.run_id)
        longest = time.monotonic() + self.options.max_wait_s
        if deadline is not None and deadline < min(wake, longest):
            self._sleep_until(deadline)
            return None
        if wake - time.monotonic() > self.options.max_wait_s:
            until = clock.later(wake - time.monotonic())
            cause = schedule.pause_cause(self.store.queries, self.run_id, until)
            return self._pause_until(wake, cause)
        self._sleep_until(wake)
        return None

    def _commit(
        self, done: list[tuple[Item, SendResult]], asked: list[Asked], free: int, busy: Counter[str]
    ) -> list[Item]:
        """Point B of the finished sends, what the senders' answers to this thread's
        questions established, and point A of up to `free` new items, one commit. `busy`:
        items still in flight (or asked about), per channel. Every status query was asked by
        a sender already: this thread only decides and records."""
        seqs = [item.seq for item, _ in done]
        if self.crash and seqs:
            self.crash.at("after-send", seqs)
        outcomes = [
            replace(
                self.judge.safely(item, sent),
                expected=ItemState.IN_FLIGHT,
                finished_at=clock.iso(sent.at),
                started_at=None if sent.started is None else clock.iso(sent.started),
            )
            for item, sent in done
            if sent.result is not None
        ]
        held_back = [item.seq for item, sent in done if sent.result is None]
        doubted_here = sum(1 for item, sent in done if self.dispatch.doubts(item, sent.result))
        channel_of = {item.seq: item.channel for item, _ in done}
        findings = self._findings(asked)
        settled = [
            replace(s.outcome, expected=s.item.state) for _, s in findings if s.outcome is not None
        ]
        stopping = self.control.stopping(clock.now())
        if held_back or stopping or self.brakes.would_halt(outcomes, channel_of):
            free = 0  # nothing new starts in a run about to stop
        # A capped channel gets new items only while under its cap, and no more than the
        # room left: while one has room, a commit claims at most that many items.
        caps = self.dispatch.caps
        full = {name for name, cap in caps.items() if busy[name] >= cap}
        exclude = sorted({*self.p.closed_gates(time.monotonic()), *full})
        room = [cap - busy[name] for name, cap in caps.items() if name not in exclude]
        free = min([free, *room])
        claimed = self.store.ledger.step(
            self.run_id,
            self.lease_version,
            [*outcomes, *settled],
            free,
            exclude_channels=exclude,
            exclude_seqs=wakes.held(self.p),
        )
        if held_back:
            # Not sent, not recorded: left in flight for whoever holds the run to settle by
            # query (nothing left, so it is sent then, once, with the same key).
            held = ", ".join(map(str, held_back))  # a sender marked why it held them back
            raise self.control.lost_error(
                self.run_id,
                f", so item(s) {held} were not sent; a resume settles them by query",
            )
        if claimed:
            # Read after this commit, before its items go to the senders: an item claimed
            # after a cancel was committed never starts.
            self._read_flags()
        for q, s in findings:
            self.p.say(s.line)
            if s.outcome is not None:
                self.p.settled(q.item, s.outcome)
            revisited = q.policy is not None
            if revisited and s.outcome is not None and s.outcome.trigger in _COUNTED:
                self.p.advance(1)
        if self.crash and seqs:
            self.crash.at("after-receipt", seqs)
        self.observer.recorded(done, outcomes)
        for outcome in outcomes:
            self._brake(self.brakes.after(outcome))
            self._brake(self.brakes.note_reach(channel_of[outcome.seq], outcome))
        self.dispatch.judged(doubted_here)
        if self.crash and claimed:
            self.crash.at("after-intent", [item.seq for item in claimed])
        return claimed

    def _findings(self, asked: list[Asked]) -> list[tuple[Question, Settlement]]:
        """What the senders' answers to this thread's questions mean
        (settle_by_query.decided). A question the stop left unasked establishes nothing: its
        item waits, as it was, for whoever settles the run next, never a halt. A conflict
        halts the run once nothing is in flight."""
        findings = []
        for a in asked:
            if isinstance(a.answer, Unasked):
                continue
            s = decided(a.question, self.channels[a.question.channel], a.answer, a.at)
            o = s.outcome
            if o is not None and o.trigger == ItemTrigger.CONFLICT:
                self.control.request(*conflict(o))
            findings.append((a.question, s))
        return findings

    def _revisit(self, inflight: dict[int, Item], *, stopping: bool) -> None:
        """Whenever nothing is in flight, else at most every POLL_S (a stream of sends must
        not postpone the revisits, nor pay a look each): hand the senders the items to ask
        about (those adopted from dead workers, and unknown items whose query_delay has
        passed, where a 404 now counts), expire what is past not_after, read the approval
        again, tell the senders which items in flight were suppressed since their claim. The
        query_delay revisits wait while the run is stopping (whoever settles it asks)."""
        if inflight and time.monotonic() < self._revisit_at:
            return
        adopted = self.coord.watch()  # other workers' gates, dead workers' items
        due = [] if stopping else self.store.queries.waiting_for_query(self.run_id, clock.now_iso())
        gated = self.p.closed_gates(time.monotonic())  # a due item waits for its gate, unasked
        due = [item for item in due if item.channel not in gated]
        for item, policy in [*((i, None) for i in adopted), *((i, self.policy) for i in due)]:
            channel = self.channels[item.channel]
            if item.seq in inflight or (item.state is ItemState.UNKNOWN and not channel.queryable):
                continue  # being asked about already; or nothing could tell more
            inflight[item.seq] = item
            self._askers.submit(question(self.store, self.run_id, channel, item, policy))
        self._expire_due()
        if self.approval.needed:
            self.approval.read(self.store.core.get_run(self.run_id))
        self.dispatch.suppressed_seen = self.store.suppressions.among(inflight.values())
        self._revisit_at = time.monotonic() + POLL_S

    def _stopping(self) -> bool:
        """Whether to stop starting sends (any stop in force: the run control); the ending
        itself waits until nothing is in flight. A lost lease ends at once: nothing more
        can be recorded."""
        if self.control.lost:
            raise self.control.lost_error(self.run_id)
        # The flags are read even when already stopping: a cancel that comes during a rate
        # pause or a drain must still reach the senders holding claimed items.
        self._read_flags()
        return self.control.stopping(clock.now())

    def _read_flags(self) -> bool:
        """Read the run's flags on this thread's connection and tell the run control (which
        the senders check before each send, instead of asking the database): a cancel, or
        on a shared run another worker halted, paused or closed it. Whether either was
        found. Read after each transaction that claimed items and at each turn: `cancel`
        returns only once this process has moved the run to cancelled, with nothing in
        flight, so a send that starts before the next read is one that cancel waits for
        (docs/guarantees.md, Cancel)."""
        cancel, moved = self.coord.signals()
        if moved is not None:
            self.control.request(Stop.MOVED, moved.value, moved_to=moved)
        if cancel is not None:
            self.control.request(Stop.CANCELLED, cancel)
        return cancel is not None or moved is not None

    # ------------------------------------------------------------------ waiting

    def _sleep_until(self, wake: float) -> None:
        while (remaining := wake - time.monotonic()) > 0:
            if self.control.stopping(clock.now()):
                return
            if self.store.queries.run_flags(self.run_id)[0]:
                return  # cancel requested: the main loop finishes the run
            self.control.wait(min(remaining, POLL_S))  # a signal or a lost lease ends it

    # ------------------------------------------------------------------ endings

    def _pause_until(self, wake: float, cause: str = "the downstream asked to wait") -> RunResult:
        # Persisted for the next process, so as wall-clock time.
        when = clock.iso(clock.later(wake - time.monotonic()))
        reason = f"{cause} until {when} (longer than --max-wait {self.options.max_wait_s:g}s)"
        said = f"paused: {cause} until {clock.local(when)}"
        return self.coord.pause(Stop.RATE_LIMITED, reason, said, paused_until=when)
