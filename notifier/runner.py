"""The send loop: settle what was in flight, then window after window of
point A (intents + attempts durable) → send → point B (outcomes durable).

W = 1 is the strict sequential protocol. With W > 1 the window's sends run on a thread
pool, but every claim and every record is still one transaction in this thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime

from . import clock
from .channels import Channel, ChannelError, ErrorKind, Receipt
from .crash import CrashPlan
from .reconcile import Finding, ask, settle
from .records import Item, Outcome
from .retry import Action, RetryPolicy
from .state_machine import ItemState, RunState
from .store import LeaseLost, Store

EXIT_DONE = 0
EXIT_ATTENTION = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130
POLL_S = 0.2


@dataclass(frozen=True)
class RunOptions:
    concurrency: int = 1
    max_wait_s: float = 600.0
    unknown_streak_limit: int = 5


@dataclass
class RunResult:
    exit_code: int
    state: RunState
    message: str


@dataclass
class _Progress:
    say: Callable[[str], None]
    advance: Callable[[int], None] = lambda n: None
    unknown_streak: int = 0
    halt: tuple[int, str] | None = None  # (exit code, reason)
    gates: dict[str, datetime] = field(default_factory=dict)  # channel → closed until


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
        interrupted: threading.Event,
        crash: CrashPlan | None = None,
        say: Callable[[str], None] = print,
        advance: Callable[[int], None] = lambda n: None,
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
        self.p = _Progress(say, advance)
        # A channel that holds one connection (SMTP) sends one request at a time.
        self._locks = {
            name: threading.Lock()
            for name, channel in channels.items()
            if not getattr(channel, "thread_safe", False)
        }
        self._pool = (
            ThreadPoolExecutor(options.concurrency, thread_name_prefix="send")
            if options.concurrency > 1
            else None
        )

    # ------------------------------------------------------------------ top level

    def run(self) -> RunResult:
        try:
            return self._run()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _run(self) -> RunResult:
        run = self.store.get_run(self.run_id)
        if run.state in (RunState.PLANNED, RunState.APPROVED):
            self.store.move_run(self.run_id, "start", self.lease_version)
        elif run.state in (RunState.PAUSED, RunState.HALTED):
            self.store.move_run(
                self.run_id, "resume", self.lease_version, paused_until=None, stop_reason=None
            )
        for channel, until in self.store.throttled_until(self.run_id).items():
            self.p.gates[channel] = clock.parse(until)
        halted = self._settle_first()
        if halted is not None:
            return halted
        while True:
            stop = self._stop_requested()
            if stop is not None:
                return stop
            self._expire_due()
            gated = self._closed_gates()
            window = self.store.claim(
                self.run_id,
                self.lease_version,
                self.options.concurrency,
                exclude_channels=gated,
            )
            if not window:
                wake = self._next_wake()
                if wake is None:
                    return self._finish()
                if (wake - clock.now()).total_seconds() > self.options.max_wait_s:
                    return self._pause_until(wake)
                self._sleep_until(wake)
                continue
            self._work(window)
            if self.p.halt is not None:
                return self._halt(*self.p.halt)

    def _settle_first(self) -> RunResult | None:
        """Nothing new starts until every item whose outcome is open has been settled."""
        settlements = settle(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            include_unknown=True,
            say=self.p.say,
        )
        for s in settlements:
            if s.outcome is not None and s.outcome.trigger == "conflict":
                return self._halt(EXIT_REFUSED, f"conflict on item {s.item.seq}: {s.outcome.error}")
        return None

    def _stop_requested(self) -> RunResult | None:
        if self.lease_lost.is_set():
            raise LeaseLost(f"run {self.run_id}: another process took over this run")
        if self.interrupted.is_set():
            self.store.move_run(
                self.run_id, "pause", self.lease_version, stop_reason="interrupted (Ctrl-C)"
            )
            return RunResult(
                EXIT_INTERRUPTED,
                RunState.PAUSED,
                "interrupted: requests already sent were recorded; the run is paused. "
                f"Continue with `notifier resume {self.run_id}`.",
            )
        cancel_requested_at, version = self.store.run_flags(self.run_id)
        if version != self.lease_version:
            raise LeaseLost(f"run {self.run_id}: another process took over this run")
        if cancel_requested_at:
            return self.finish_cancel()
        return None

    def finish_cancel(self) -> RunResult:
        self.store.move_run(self.run_id, "cancel", self.lease_version)
        counts = self.store.counts(self.run_id)
        return RunResult(
            EXIT_ATTENTION,
            RunState.CANCELLED,
            f"cancelled: {counts['sent']} sent, {counts['unknown']} unknown, "
            f"{counts['pending']} never attempted, {counts['failed']} failed.",
        )

    # ------------------------------------------------------------------ one window

    def _expire_due(self) -> None:
        expired = self.store.expire_due(self.run_id, self.lease_version)
        if expired:
            self.p.advance(len(expired))
            shown = ", ".join(str(seq) for seq in expired[:10])
            more = f" and {len(expired) - 10} more" if len(expired) > 10 else ""
            self.p.say(f"expired (past not_after, never sent): item {shown}{more}")

    def _stale(self, window: list[Item]) -> tuple[list[Item], list[Outcome]]:
        """Claimed items whose deadline passed are not sent. One never possibly delivered
        goes back to pending, where the next expiry pass expires it; one whose last attempt
        may have been delivered becomes unknown, to be settled rather than expired blindly."""
        now = clock.now()
        fresh: list[Item] = []
        outcomes: list[Outcome] = []
        for item in window:
            if item.not_after is None or clock.parse(item.not_after) > now:
                fresh.append(item)
                continue
            previous = self.store.attempts(self.run_id, item.seq)[:-1]
            uncertain = bool(previous) and previous[-1].outcome in (
                ErrorKind.UNCERTAIN.value,
                "interrupted",
            )
            outcomes.append(
                Outcome(
                    item.seq,
                    "lose" if uncertain else "retry_later",
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

    def _work(self, window: list[Item]) -> None:
        window, stale = self._stale(window)
        if stale:
            self.store.record(self.run_id, self.lease_version, stale)
            for outcome in stale:
                self._after(outcome)
        if not window:
            return
        seqs = [item.seq for item in window]
        if self.crash:
            self.crash.at("after-intent", seqs)
        results = self._send_all(window)
        if self.crash:
            self.crash.at("after-send", seqs)
        outcomes = [
            replace(
                self._judge(item, result, at),
                expected=ItemState.IN_FLIGHT,
                finished_at=clock.iso(at),
            )
            for item, (result, at) in zip(window, results, strict=True)
        ]
        self.store.record(self.run_id, self.lease_version, outcomes)
        if self.crash:
            self.crash.at("after-receipt", seqs)
        for outcome in outcomes:
            self._after(outcome)

    def _send_all(self, window: list[Item]) -> list[tuple[Receipt | ChannelError, datetime]]:
        if self._pool is None or len(window) == 1:
            return [self._send_one(item) for item in window]
        return list(self._pool.map(self._send_one, window))

    def _send_one(self, item: Item) -> tuple[Receipt | ChannelError, datetime]:
        """The result and the moment it arrived: waits (Retry-After) count from then."""
        result: Receipt | ChannelError
        try:
            with self._locks.get(item.channel) or nullcontext():
                result = self.channels[item.channel].send(item.intent())
        except ChannelError as exc:
            result = exc
        except Exception as exc:  # a channel bug: the request may have left, so be careful
            result = ChannelError(ErrorKind.UNCERTAIN, f"unexpected {type(exc).__name__}: {exc}")
        return result, clock.now()

    def _judge(self, item: Item, result: Receipt | ChannelError, at: datetime) -> Outcome:
        """Turn one send result into the item's next state (DESIGN section 7)."""
        if isinstance(result, Receipt):
            if result.intent_digest and result.intent_digest != item.intent_digest:
                return Outcome(
                    item.seq,
                    "conflict",
                    "conflict",
                    error=f"conflict: downstream answered for {result.intent_digest}",
                )
            return Outcome(
                item.seq, "ack", "sent", receipt_id=result.receipt_id, receipt_source="send"
            )
        error = result
        channel = self.channels[item.channel]
        verdict = self.policy.judge(
            error,
            attempts=item.attempts,
            elapsed_s=self._elapsed(item),
            idempotent=channel.idempotent,
            queryable=channel.queryable,
        )
        # Every branch closes the attempt with what the error said.
        closed = Outcome(
            item.seq,
            "lose",
            error.kind.value,
            http_status=error.http_status,
            error=str(error),
            retry_after_s=error.retry_after,
        )
        message = str(error)
        if verdict.action is Action.RETRY:
            next_at = clock.later(verdict.wait_s, at)
            if verdict.pause_channel:
                self.p.gates[item.channel] = max(next_at, self.p.gates.get(item.channel, next_at))
            return replace(closed, trigger="retry_later", next_attempt_at=clock.iso(next_at))
        if verdict.action in (Action.QUERY, Action.EXHAUSTED) and channel.queryable:
            return self._judge_by_query(item, error, channel, closed, at)
        if verdict.action is Action.CONFLICT:
            return replace(closed, trigger="conflict", error=f"conflict: {message}")
        if verdict.action is Action.GONE:
            self.p.halt = (EXIT_ATTENTION, f"endpoint gone (item {item.seq}): {message}")
            return replace(closed, trigger="give_up")
        if verdict.action is Action.FAIL:
            return replace(closed, trigger="give_up")
        if verdict.action is Action.EXHAUSTED and not self._maybe_delivered(item, error):
            return replace(
                closed,
                trigger="give_up",
                error=f"gave up after {item.attempts} attempts: {message}",
            )
        return replace(closed, error=f"{message}; may have been delivered, not sent again")

    def _judge_by_query(
        self, item: Item, error: ChannelError, channel: Channel, closed: Outcome, at: datetime
    ) -> Outcome:
        """A maybe-delivered item on a channel that cannot dedupe: ask before anything else."""
        answer = ask(channel, item)
        message = f"{error}; {answer.detail}"
        if answer.finding is Finding.FOUND and answer.receipt is not None:
            return replace(
                closed,
                trigger="found",
                error=None,
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence="query after an uncertain send",
            )
        if answer.finding is Finding.CONFLICT:
            return replace(closed, trigger="conflict", error=f"conflict: {message}")
        if answer.finding is Finding.NOT_FOUND:
            retry = self.policy.judge(
                error,
                attempts=item.attempts,
                elapsed_s=self._elapsed(item),
                idempotent=True,
                queryable=True,
            )
            if retry.action is Action.RETRY:
                # Proven undelivered, so re-sending under the same key is safe.
                return replace(
                    closed,
                    trigger="not_found",
                    error=message,
                    next_attempt_at=clock.iso(clock.later(retry.wait_s, at)),
                )
            return replace(
                closed,
                trigger="give_up",
                error=f"gave up after {item.attempts} attempts: {message}",
            )
        return replace(closed, error=f"{message}; may have been delivered, not sent again")

    def _elapsed(self, item: Item) -> float:
        if item.attempts <= 1:
            return 0.0
        first = self.store.attempts(self.run_id, item.seq)[0].started_at
        return (clock.now() - clock.parse(first)).total_seconds()

    def _maybe_delivered(self, item: Item, error: ChannelError) -> bool:
        if error.kind is ErrorKind.UNCERTAIN:
            return True
        return any(
            a.outcome in (ErrorKind.UNCERTAIN.value, "interrupted")
            for a in self.store.attempts(self.run_id, item.seq)
        )

    def _after(self, outcome: Outcome) -> None:
        if outcome.trigger in ("ack", "found", "give_up", "conflict", "lose"):
            self.p.advance(1)
        if outcome.trigger in ("ack", "found"):
            self.p.unknown_streak = 0
        elif outcome.trigger == "lose":
            self.p.unknown_streak += 1
            self.p.say(f"item {outcome.seq}: unknown — {outcome.error}")
            if self.p.unknown_streak >= self.options.unknown_streak_limit and self.p.halt is None:
                self.p.halt = (
                    EXIT_ATTENTION,
                    f"{self.p.unknown_streak} unknown outcomes in a row: check the downstream, "
                    "then `notifier reconcile` or `notifier resume`",
                )
        elif outcome.trigger in ("give_up", "conflict"):
            self.p.say(f"item {outcome.seq}: failed — {outcome.error}")
        if outcome.trigger == "conflict":
            # Whatever revealed it (a 422, a query, a receipt for another digest), a key held
            # by another intent means something else writes under our keys: stop, exit 4.
            self.p.halt = (EXIT_REFUSED, f"conflict on item {outcome.seq}: {outcome.error}")

    # ------------------------------------------------------------------ waiting

    def _closed_gates(self) -> list[str]:
        now = clock.now()
        return [name for name, until in self.p.gates.items() if until > now]

    def _next_wake(self) -> datetime | None:
        """When the next pending item may start: its own next_attempt_at, but no earlier than
        its channel's gate. None when nothing is pending."""
        wakes = []
        for channel, earliest in self.store.pending_by_channel(self.run_id):
            wake = clock.parse(earliest) if earliest else clock.now()
            gate = self.p.gates.get(channel)
            wakes.append(max(wake, gate) if gate else wake)
        return min(wakes) if wakes else None

    def _sleep_until(self, wake: datetime) -> None:
        while (remaining := (wake - clock.now()).total_seconds()) > 0:
            if self.interrupted.is_set() or self.lease_lost.is_set():
                return
            if self.store.run_flags(self.run_id)[0]:
                return  # cancel requested: the main loop finishes the run
            time.sleep(min(remaining, POLL_S))

    # ------------------------------------------------------------------ endings

    def _pause_until(self, wake: datetime) -> RunResult:
        when = clock.iso(wake)
        reason = f"rate limited until {when} (longer than --max-wait {self.options.max_wait_s:g}s)"
        self.store.move_run(
            self.run_id, "pause", self.lease_version, paused_until=when, stop_reason=reason
        )
        return RunResult(
            EXIT_ATTENTION,
            RunState.PAUSED,
            f"paused: the downstream asked to wait until {clock.local(when)}. "
            f"Run `notifier resume {self.run_id}` after that time.",
        )

    def _halt(self, code: int, reason: str) -> RunResult:
        self.store.move_run(self.run_id, "halt", self.lease_version, stop_reason=reason)
        return RunResult(code, RunState.HALTED, f"halted: {reason}")

    def _finish(self) -> RunResult:
        counts = self.store.counts(self.run_id)
        summary = (
            f"{counts['sent']} sent, {counts['unknown']} unknown, {counts['failed']} failed, "
            f"{counts['pending'] + counts['in_flight']} pending"
        )
        if counts.get("expired"):
            summary += f", {counts['expired']} expired (past not_after, never sent)"
        if counts["unknown"]:
            reason = f"{counts['unknown']} item(s) with unknown outcome"
            self.store.move_run(self.run_id, "pause", self.lease_version, stop_reason=reason)
            return RunResult(
                EXIT_ATTENTION,
                RunState.PAUSED,
                f"{summary}. Settle the unknown items with `notifier reconcile --manual "
                f"{self.run_id}`.",
            )
        self.store.move_run(self.run_id, "complete", self.lease_version)
        code = EXIT_ATTENTION if counts["failed"] else EXIT_DONE
        return RunResult(code, RunState.COMPLETED, f"completed: {summary}.")
