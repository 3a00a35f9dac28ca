"""The rows of the store as frozen records. The store reads and writes them; every other
layer passes them around without touching SQL."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from notifier.domain.intent import Intent
from notifier.domain.state_machine import ItemState, ItemTrigger, RunState


class AttemptOutcome(StrEnum):
    """How an attempt ended, as `attempts.outcome` stores it: the class of the channel's
    answer (`sent`, or a channels.ErrorKind value), or why no answer came."""

    SENT = "sent"  # a receipt: delivered
    NOT_SENT = "not_sent"  # the request never left (refused, DNS)
    THROTTLED = "throttled"  # 429/503: seen, not processed
    UNCERTAIN = "uncertain"  # timeout or reset after sending, 408, 500/502/504
    PARTIAL = "partial"  # delivered to some of the channel's destinations
    IN_PROGRESS = "in_progress"  # 409: the first request under this key is still running
    CONFLICT = "conflict"  # another intent holds the key
    GONE = "gone"  # 410
    PERMANENT = "permanent"  # any other refusal
    NOT_STARTED = "not_started"  # claimed, released before its request left
    EXPIRED = "expired"  # claimed, past its not_after before its request left
    INTERRUPTED = "interrupted"  # left open by a stop or a crash, closed when settled


# Outcomes of a claim whose request never left.
NEVER_LEFT = frozenset({AttemptOutcome.NOT_STARTED, AttemptOutcome.EXPIRED})
# Outcomes that prove the request never reached the downstream (or was seen and refused
# unprocessed, 429/503); any other attempt may have reached it.
NEVER_REACHED = NEVER_LEFT | {AttemptOutcome.NOT_SENT, AttemptOutcome.THROTTLED}
# THE rule of "maybe delivered": outcomes after which the request may have been processed
# downstream and nothing says whether it was. The decision's predicate (`maybe_delivered`,
# evidence.History) and every SQL condition (store/statements MAYBE_DELIVERED) are made
# from this one set. A partial delivery reached some destinations: never "not delivered".
MAYBE_DELIVERED_OUTCOMES = frozenset(
    {
        AttemptOutcome.UNCERTAIN,
        AttemptOutcome.IN_PROGRESS,
        AttemptOutcome.INTERRUPTED,
        AttemptOutcome.PARTIAL,
    }
)


def maybe_delivered(attempt: Attempt) -> bool:
    """Whether `attempt` may have delivered its item: an outcome that proves nothing, and no
    later query (`not_found`) or operator (`mark_not_sent`) that proved otherwise."""
    return attempt.outcome in MAYBE_DELIVERED_OUTCOMES and not attempt.disproved


class EventKind(StrEnum):
    """The event kinds, besides the state machines' triggers (an item's move is logged under
    its trigger, a run's as `run_` + its trigger), that replay.py reads."""

    PLANNED = "planned"
    FROZEN = "frozen"
    REDRAFT = "redraft"  # a run's rows drafted again: its new fingerprint, its approval cleared
    DRAFTED = "drafted"  # a --compose row's draft stored (its digest)
    # A row drafted again after the freeze: its new draft's digest, its intent's, and the
    # item planned again (failed or pending, never attempted, to pending).
    REDRAFTED = "redrafted"
    APPROVAL_RENEWED = "approval_renewed"
    DECISION = "decision"
    # A --compose row whose draft failed, or that another run took meanwhile: planned and
    # failed at once, outside the item machine (it was never pending to anyone).
    FAILED_AT_FREEZE = "failed_at_freeze"
    # A pending item whose window a claim found closed again, given the window's next
    # opening as its start time (store/waiting.py): no state moves; its start time from and to.
    REOPENED = "reopened"


class StopCause(StrEnum):
    """Why a run stopped short of completing (`runs.stop_cause`, beside `stop_reason`, the
    same in prose for people): what a worker that finds the run moved, and a reconcile,
    read. Never parsed from the prose."""

    # Paused until `paused_until`: a wait longer than --max-wait (a Retry-After, --rate, a
    # start time or a send window).
    RATE_LIMITED = "rate_limited"
    APPROVAL_EXPIRED = "approval_expired"  # paused: no send starts without a valid approval
    CHANNEL_DOWN = "channel_down"  # paused: a channel's receiver cannot be reached
    INTERRUPTED = "interrupted"  # paused: Ctrl-C or SIGTERM
    UNKNOWN_LEFT = "unknown_left"  # paused: items of unknown outcome wait for a reconcile
    HALTED = "halted"  # a safety rule: an endpoint gone, too many unknowns in a row
    CONFLICT = "conflict"  # halted: the downstream holds another intent under our key
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # cancelled while awaiting approval (`notifier reject`)


def unknown_left_reason(unknown: int) -> str:
    """The stop reason of a run paused for `unknown` items of unknown outcome."""
    return f"{unknown} item(s) with unknown outcome"


@dataclass(frozen=True)
class Run:
    run_id: str
    state: RunState
    created_at: str
    updated_at: str
    batch_path: str
    fingerprint: str
    channel_snapshot: dict[str, Any]
    options: dict[str, Any]
    contract_version: str
    lease_owner: dict[str, Any] | None
    lease_version: int
    lease_expires_at: str | None
    cancel_requested_at: str | None
    paused_until: str | None
    stop_reason: str | None
    key_nonce: str | None  # None for a run planned before m002 (its keys have no nonce)
    # None only when read from a database m002 has not been applied to (read-only commands).
    content_fingerprint: str | None
    approval: dict[str, Any] | None = None  # ops/approval.py reads it; None is never "approved"
    stop_cause: StopCause | None = None  # None: running, completed, or no cause recorded


@dataclass(frozen=True)
class Worker:
    """One worker's lease on a run (PostgreSQL: many per run)."""

    worker_id: str
    run_id: str
    host: str
    pid: int
    process_start: str | None
    pid_space: str | None  # membership.PID_SPACE of the worker (None: written before m015)
    state: str  # live | released | reaped
    version: int
    joined_at: str
    heartbeat_at: str
    expires_at: str
    in_flight: int = 0

    @property
    def owner(self) -> dict[str, Any]:
        """As lease.holder_alive reads a lease holder."""
        return {
            "host": self.host,
            "pid": self.pid,
            "pid_space": self.pid_space,
            "started": self.process_start,
            "token": self.worker_id,
        }


@dataclass(frozen=True)
class Item:
    run_id: str
    seq: int
    item_id: str
    channel: str
    target: str
    payload: dict[str, Any]
    idempotency_key: str
    intent_digest: str
    state: ItemState
    attempts: int
    next_attempt_at: str | None
    receipt_id: str | None
    last_error: str | None
    not_after: str | None = None  # the deadline in the payload, copied for the claim's index
    # When it may go out (schema_sqlite.M009): not part of the intent.
    not_before: str | None = None
    send_window: str | None = None
    send_tz: str | None = None

    def intent(self) -> Intent:
        return Intent(
            run_id=self.run_id,
            seq=self.seq,
            item_id=self.item_id,
            channel=self.channel,
            target=self.target,
            payload=self.payload,
            idempotency_key=self.idempotency_key,
            intent_digest=self.intent_digest,
        )


@dataclass(frozen=True)
class Outcome:
    """What one attempt (or one settlement) established about one item."""

    seq: int
    trigger: ItemTrigger
    attempt_outcome: AttemptOutcome | None = None  # closes the item's open attempt with it
    http_status: int | None = None
    error: str | None = None
    receipt_id: str | None = None
    receipt_source: str | None = None  # send | query | manual: a receipt row is written
    evidence: str | None = None
    next_attempt_at: str | None = None
    retry_after_s: float | None = None
    # The state the caller saw the item in; the UPDATE is conditional on it still holding.
    expected: ItemState | None = None
    finished_at: str | None = None  # when the answer arrived (default: when recorded)
    # When the request left. The attempt was opened with its claim time, which for an item
    # claimed ahead is earlier: a Retry-After or a query window counts from the request.
    started_at: str | None = None
    # A throttled answer closes the item's channel until then (shared by a run's workers).
    gate_until: str | None = None
    # A permanent rejection of the recipient, on a channel whose `suppress_on_reject` is on:
    # the address (normalised) and the reply, put on the suppression list with the failure.
    suppress_address: str | None = None
    suppress_reason: str | None = None


@dataclass(frozen=True)
class Counts:
    """How many items of a run are in each state (read from the per-run counters that every
    item move keeps, so reading them costs the same for 10 items as for a million)."""

    total: int = 0
    pending: int = 0
    in_flight: int = 0
    sent: int = 0
    unknown: int = 0
    failed: int = 0
    expired: int = 0
    suppressed: int = 0
    # Of the failed, those an operator abandoned (FailedKind.ABANDONED: maybe delivered),
    # named in every summary; not a state of its own, so never in `as_json`'s counts.
    abandoned: int = 0

    @classmethod
    def of(cls, by_state: Mapping[str, int], abandoned: int = 0) -> Counts:
        """From state → count (states absent count 0); `total` is their sum."""
        known = {s.value: int(by_state.get(s.value, 0)) for s in ItemState}
        return cls(total=sum(known.values()), abandoned=abandoned, **known)

    @property
    def unfinished(self) -> int:
        """Items that still need a send or a settlement: pending, in flight or unknown."""
        return self.pending + self.in_flight + self.unknown

    def as_json(self) -> dict[str, int]:
        """The report's `counts` object (docs/design.md section 11): total, then every state."""
        return {"total": self.total, **{s.value: getattr(self, s.value) for s in ItemState}}

    def summary(self, never_attempted: int | None = None, not_delivered: int = 0) -> str:
        """The one line every command prints about a run's items: "N sent, [N in flight,] N
        unknown, N failed, N pending", and expired and suppressed ones when there are; the
        failed an operator abandoned are named among them as maybe delivered.
        With `never_attempted` (a cancel), pending is split by why: a cancelled run must not
        call a retry that was attempted "never attempted"."""
        line = f"{self.sent} sent, "
        if self.in_flight:
            # Items left mid-send: resume settles them first, so say how many. Never counted
            # as pending, not even in a cancel's split: they may have been delivered.
            line += f"{self.in_flight} in flight, "
        line += f"{self.unknown} unknown, {self.failed} failed, "
        if self.abandoned:
            line = line.removesuffix(", ") + f" ({self.abandoned} abandoned, maybe delivered), "
        if never_attempted is None:
            line += f"{self.pending} pending"
        else:
            maybe = self.pending - never_attempted - not_delivered
            line += (
                f"{self.pending} pending ({never_attempted} never attempted, {not_delivered} "
                f"attempted but not delivered"
                + (f", {maybe} attempted and maybe delivered" if maybe else "")
                + ")"
            )
        if self.expired:
            line += f", {self.expired} expired (past not_after, never sent)"
        if self.suppressed:
            line += f", {self.suppressed} suppressed (on the suppression list, never sent)"
        return line

    def failed_detail(self) -> dict[str, int]:
        """The reports' `failed_detail`: the failed split into rows never delivered and rows
        an operator abandoned, which may have been delivered (FailedKind)."""
        return {
            FailedKind.NOT_DELIVERED.value: self.failed - self.abandoned,
            FailedKind.ABANDONED.value: self.abandoned,
        }

    def cancel_summary(self, kinds: Sequence[PendingKind]) -> str:
        """`summary` of a cancelled run, whoever closed it: its pending items split by why
        (`kinds`: the kind of each pending item attempted before)."""
        waiting = kinds.count(PendingKind.RETRY_WAITING)
        return self.summary(self.pending - len(kinds), waiting)


class PendingKind(StrEnum):
    """Why an item is pending: `pending` alone mixes never-tried items with retries."""

    NEVER_ATTEMPTED = "never_attempted"
    RETRY_WAITING = "retry_waiting"  # attempted; known not delivered (429, refused, not found)
    MAYBE_DELIVERED = "maybe_delivered"  # attempted; an uncertain attempt is not disproven


class FailedKind(StrEnum):
    """Why an item is failed: `failed` alone mixes rows never delivered with rows an
    operator abandoned (`--mark abandon`: nobody can tell, so maybe delivered)."""

    NOT_DELIVERED = "not_delivered"  # refused, a conflict, proven undelivered, marked not sent
    ABANDONED = "abandoned"  # maybe delivered: never sent again unless marked not sent


@dataclass(frozen=True)
class Attempt:
    seq: int
    n: int
    started_at: str
    finished_at: str | None
    outcome: AttemptOutcome | None  # None: still open
    http_status: int | None
    error: str | None
    waited_s: float | None
    retry_after_s: float | None
    # A later `not_found` or `mark_not_sent` of its item proved it delivered nothing.
    disproved: bool = False


@dataclass(frozen=True)
class ManualDecision:
    seq: int
    item_id: str
    operator: str
    at: str
    decision: str
    evidence: str


@dataclass(frozen=True)
class StoredDraft:
    """One row of a --compose run: its validated source row and its draft (or failure)."""

    seq: int
    line: int
    source: str
    state: str  # pending | drafted | failed
    subject: str | None
    body: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    error: str | None


class Row(Protocol):
    """A row as the store reads it: a named tuple (`row.state`), whichever engine read it,
    so the records above the store do not know which one that was."""

    def _asdict(self) -> dict[str, Any]: ...


_ITEM_FIELDS = tuple(Item.__dataclass_fields__)
_RUN_FIELDS = tuple(Run.__dataclass_fields__)


def notifications(n: int) -> str:
    """`n notifications`, in the singular for one."""
    return f"{n} notification" if n == 1 else f"{n} notifications"


def item_from_row(row: Row, **changes: Any) -> Item:
    """The item a row of `items` holds, with `changes` made (one object built, not two)."""
    # A file opened read-only before m003 has no not_after column: the default stands.
    columns = row._asdict()
    values = {name: columns[name] for name in _ITEM_FIELDS if name in columns}
    values["payload"] = json.loads(values["payload"])
    values["state"] = ItemState(values["state"])
    values.update(changes)
    return Item(**values)


def run_from_row(row: Row) -> Run:
    # A read-only command does not migrate, so an older file may lack the newer columns.
    columns = row._asdict()
    values: dict[str, Any] = {name: columns.get(name) for name in _RUN_FIELDS}
    values["state"] = RunState(values["state"])
    values["channel_snapshot"] = json.loads(values["channel_snapshot"])
    values["options"] = json.loads(values["options"])
    values["lease_owner"] = json.loads(values["lease_owner"]) if values["lease_owner"] else None
    values["approval"] = _json_object(values["approval"])
    values["stop_cause"] = StopCause(values["stop_cause"]) if values["stop_cause"] else None
    return Run(**values)


def _json_object(text: str | None) -> dict[str, Any] | None:
    """A JSON object column; anything else (absent, garbled, not an object) is None."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
