"""Judging one send result: what the answer (or the error) says about delivery, and so the
item's next state (docs/design.md section 7). Every throttled answer closes its channel's gate; a
bug while judging costs only that item's certainty, never the other outcomes of a commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from notifier.channels import Channel
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.decide import (
    NEVER_REACHED,
    AfterSend,
    Answer,
    Caps,
    HaltCause,
    History,
    NotStarted,
    Sent,
    Unasked,
    acknowledged,
    decide,
)
from notifier.domain.records import AttemptOutcome, Item, Outcome
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import ItemTrigger
from notifier.engine.run_control import RunControl, Stop
from notifier.store import Store

__all__ = ["NEVER_REACHED", "Judge", "NotStarted", "Progress", "SendResult", "Sent"]

# How the run stops for a halt a decision asks for.
_HALTS = {HaltCause.HALTED: Stop.HALTED, HaltCause.CONFLICT: Stop.CONFLICT}


@dataclass(frozen=True)
class SendResult:
    """What one sender hands the committer for one item."""

    result: Sent | None  # None: not sent, this worker could not prove it still held the run
    at: datetime  # when it came, on the wall clock (to record) ...
    mono: float  # ... and the monotonic one (waits count from it)
    started: datetime | None = None  # when its request left (None: no request)
    # After an uncertain answer, what the sender's status query found (None: no query
    # wanted; Unasked: wanted, but the run was stopping, or put off).
    finding: Answer | Unasked | None = None
    # A throttled answer: the wait the sender closed its channel for at once; the decision
    # uses it, so the gate is drawn and set once.
    gate_s: float | None = None


@dataclass
class Progress:
    """What the send loop keeps between sends: progress, the brakes' counts, and the
    channel gates and item holds it times on the monotonic clock (whether to stop is the
    run control's, run_control.py)."""

    say: Callable[[str], None]
    advance: Callable[[int], None] = lambda n: None
    unknown_streak: int = 0
    # Per channel: requests in a row that could not reach its receiver (Brakes.note_reach).
    unreached: dict[str, int] = field(default_factory=dict)
    # In-process waits run on the monotonic clock (time.monotonic()), so a step of the wall
    # clock cannot end them early; the wall-clock next_attempt_at stored with an item is only
    # for the next process.
    gates: dict[str, float] = field(default_factory=dict)  # channel → closed until (monotonic)
    holds: dict[int, float] = field(default_factory=dict)  # item seq → not before (monotonic)

    # Told of every gate closed or lengthened: (channel, now, until), monotonic (metrics, logs).
    on_gate: Callable[[str, float, float], None] | None = None
    # Told of every item settled by a query (resume, a revisit, adoption, cancel) or by its
    # deadline, once recorded: the JSON log's `outcome` event, as for a send's outcome.
    on_settled: Callable[[Item, Outcome], None] | None = None
    # Senders close gates too, the moment a throttled answer arrives (Dispatch._warn).
    _gate_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def gate(self, channel: str, until: float) -> None:
        """Close `channel` until the monotonic time `until` (a gate only ever lengthens)."""
        with self._gate_lock:
            self.gates[channel] = max(until, self.gates.get(channel, until))
        if self.on_gate is not None:
            self.on_gate(channel, time.monotonic(), until)

    def settled(self, item: Item, outcome: Outcome) -> None:
        """`item`'s settlement `outcome` is recorded (not by the answer to its send)."""
        if self.on_settled is not None:
            self.on_settled(item, outcome)

    def closed_gates(self, now: float) -> dict[str, float]:
        """The gates still closed at monotonic `now`, as a copy (senders may add to them)."""
        with self._gate_lock:
            return {channel: until for channel, until in self.gates.items() if until > now}


class Judge:
    """Turns send results into outcomes for one run (decide.decide, the one decision), and
    applies what they mean for this process: holds, gates, and a halt, asked of the run
    control."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        channels: Mapping[str, Channel],
        policy: RetryPolicy,
        progress: Progress,
        control: RunControl,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.channels = channels
        self.policy = policy
        self.p = progress
        self.control = control

    def safely(self, item: Item, sent: SendResult) -> Outcome:
        """`judge`, but an unexpected exception (a bug) costs only this item's certainty:
        never the window's other outcomes, never a receipt in hand."""
        result = sent.result
        assert result is not None  # a send held back is never judged
        try:
            return self.judge(item, sent)
        except Exception as exc:
            problem = f"unexpected {type(exc).__name__} while judging the answer: {exc}"
        if isinstance(result, NotStarted):
            return Outcome(item.seq, ItemTrigger.RELEASE, AttemptOutcome.NOT_STARTED)
        if isinstance(result, Receipt):
            if not result.replayed and result.intent_digest in (None, item.intent_digest):
                # The downstream said it holds the delivery; what broke came after that.
                return acknowledged(item, result)
            # A replay, or a receipt naming another intent, proves no delivery of ours (nor
            # none) without the decision that just broke: maybe delivered, never sent.
            said = "a replay" if result.replayed else "a receipt for another intent"
            return Outcome(
                item.seq,
                ItemTrigger.LOSE,
                AttemptOutcome.UNCERTAIN,
                error=f"{problem}; the answer was {said}, which proves no delivery of ours: "
                "may have been delivered, not sent again",
            )
        # Judge again as an uncertain answer, by the channel's own rules (an idempotent
        # channel may retry under the same key; others go by the query's finding or are
        # left unknown).
        uncertain = ChannelError(ErrorKind.UNCERTAIN, f"{result}; {problem}")
        try:
            return self.judge(item, replace(sent, result=uncertain, gate_s=None))
        except Exception as exc:
            return Outcome(
                item.seq,
                ItemTrigger.LOSE,
                AttemptOutcome.UNCERTAIN,
                http_status=result.http_status,
                error=f"{uncertain}; unexpected {type(exc).__name__}: {exc}; "
                "may have been delivered, not sent again",
                retry_after_s=result.retry_after,
            )

    def judge(self, item: Item, sent: SendResult) -> Outcome:
        """The item's next state after its send's result (and its sender's status query's
        finding), decided once: the answer arrived at `sent.at` (wall) / `sent.mono`
        (monotonic), its request having left at `sent.started` (a 404 counts from then plus
        the query window). The committer never asks the channel itself: where the decision
        would want a query no sender made, the item is left unknown, to be asked about once
        its query_delay has passed (`Unasked`). A gate the sender closed is not closed again."""
        result = sent.result
        assert result is not None  # a send held back is never judged
        finding = sent.finding if sent.finding is not None else Unasked()
        decision = decide(
            item,
            AfterSend(result, finding, sent.started, gate_s=sent.gate_s),
            caps=Caps.of(self.channels[item.channel]),
            policy=self.policy,
            history=self.history(item, result),
            now=sent.at,
        )
        if decision.gate_s is not None and sent.gate_s is None:
            self.p.gate(item.channel, sent.mono + decision.gate_s)
        if decision.hold_s is not None:
            self.p.holds[item.seq] = sent.mono + decision.hold_s
        if decision.halt is not None:
            self.control.request(_HALTS[decision.halt.cause], decision.halt.detail)
        assert decision.outcome is not None  # every answer to a send ends in a move
        return decision.outcome

    def history(self, item: Item, result: Sent | None) -> History:
        """The item's earlier attempts, read only where the decision may rest on them: an
        error, or a replayed receipt, after an earlier attempt."""
        if isinstance(result, NotStarted) or (
            isinstance(result, Receipt) and not (result.replayed and item.attempts > 1)
        ):
            return History()
        return self.history_of(item)

    def history_of(self, item: Item) -> History:
        return History.of(self.store.queries.attempts(self.run_id, item.seq))
