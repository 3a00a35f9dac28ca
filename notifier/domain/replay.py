"""Replay: a run's items, attempts, receipts and decisions rebuilt from its events alone,
through the same state machines that allowed each move (state_machine.py), and compared
with the rows stored. No I/O and no store: the records come from whoever read them (the
live store's store/audit.py, or an exported file), and nothing is sent or written.

Beside the moves, the events chain what was planned: the run's fingerprint (at its plan, its
freeze, each redraft) and its approval record (at `run_approve`, each renewal; a redraft
clears it). An item's digest is recomputed from the target and payload it holds
(`compare_intents`), and the run's fingerprint from those digests (verify.py): so an intent
rewritten, with or without its digest and the run's fingerprint, is named. A --compose run
chains what its intents will be made of: at its plan the digest of its sources, template,
channel snapshot and key nonce (`intent.DraftingInputs`), and each draft's digest when it is
stored (`drafted`, `redrafted`): a draft or an input rewritten while the run drafts is named
(and refused by the freeze: content/compose.py). When each item may be sent (its start time,
window and zone: no intent digest covers them) is chained with the items (intent.Schedules,
checked by verify.py), and each start time a claim moves after (`reopened`) replayed here.

Each item event carries what its move wrote (store/core.py `move_item`, store/ledger.py):
`set` (the item columns), `attempt` (the attempt it closed) and `receipt` (the receipt it
stored); a claim (`start`) opens an attempt as the store's claim does. So the rebuild needs
no row but the list of the run's items, and any row edited, deleted or added afterwards
differs from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from notifier.domain.clock import parse
from notifier.domain.intent import draft_digest, intent_digest
from notifier.domain.records import EventKind, StopCause, unknown_left_reason
from notifier.domain.state_machine import (
    IllegalMove,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
    item_target,
    run_next,
)

# The item columns an event's `set` may write, and replay compares.
ITEM_COLUMNS = ("receipt_id", "last_error", "next_attempt_at")
# Why a run stopped (the prose `status` prints, and its cause): written with the run's moves.
STOP_COLUMNS = ("stop_reason", "stop_cause")
_TRIGGERS = frozenset(t.value for t in ItemTrigger)
_RUN_EVENT = "run_"


# ---------------------------------------------------------------- the records read


class EventRecord(NamedTuple):
    run_id: str
    seq_no: int
    at: str
    kind: str
    item_seq: int | None
    detail: str | None
    prev_hash: str | None
    hash: str | None


class ItemRecord(NamedTuple):
    seq: int
    item_id: str
    state: str
    attempts: int
    receipt_id: str | None
    last_error: str | None
    next_attempt_at: str | None


class IntentRecord(NamedTuple):
    """What an item sends: its digest as stored, and what it is recomputed from (payload:
    its JSON text; None where it is not at hand, an export without bodies); and the key it
    is sent under (None where it is not at hand)."""

    seq: int
    channel: str
    target: str
    payload: str | None
    intent_digest: str
    idempotency_key: str | None = None
    # Its row identity (items.identity, what `send` compares a later file's rows with) and
    # a --compose row's source digest (drafts.source_digest); None where not at hand.
    identity: str | None = None
    source_digest: str | None = None
    # The row digest it is compared under as an id-less row of its content would be
    # (items.row_digest, else its intent digest); None where not at hand.
    row_digest: str | None = None
    # Its deadline as the engine reads it (items.not_after: a copy of the payload's, kept
    # for the claim's index, never written again), where `deadline_at_hand`.
    not_after: str | None = None
    deadline_at_hand: bool = False
    # When it may be sent (items.not_before, send_window, send_tz: m009), where
    # `schedule_at_hand`. No digest of it covers them: the events do (intent.Schedules).
    not_before: str | None = None
    send_window: str | None = None
    send_tz: str | None = None
    schedule_at_hand: bool = False


class DraftRecord(NamedTuple):
    """A --compose row as stored: its source and its draft."""

    seq: int
    state: str
    source: str
    subject: str | None
    body: str | None


class AttemptRecord(NamedTuple):
    seq: int
    n: int
    started_at: str
    finished_at: str | None
    outcome: str | None
    http_status: int | None
    error: str | None
    retry_after_s: float | None
    waited_s: float | None


class ReceiptRecord(NamedTuple):
    seq: int
    receipt_id: str | None
    source: str
    evidence: str | None
    recorded_at: str
    # The digest of the intent it proves delivered: its item's, copied as it is stored
    # (store/ledger.py); None where not at hand (an export). No event records it: verify.py
    # checks it against its item's.
    intent_digest: str | None = None


class DecisionRecord(NamedTuple):
    seq: int
    operator: str
    at: str
    decision: str
    evidence: str


@dataclass(frozen=True)
class RunRows:
    """A run's stored rows, as verify.py compares them with their replay."""

    state: str
    items: Sequence[ItemRecord]
    attempts: Sequence[AttemptRecord]
    receipts: Sequence[ReceiptRecord]
    decisions: Sequence[DecisionRecord]
    intents: Sequence[IntentRecord] = ()
    # A --compose run's rows in these seqs; None where they are not at hand (an export).
    drafts: Sequence[DraftRecord] | None = None


# ---------------------------------------------------------------- what replay finds


class Table(StrEnum):
    RUNS = "runs"
    ITEMS = "items"
    ATTEMPTS = "attempts"
    RECEIPTS = "receipts"
    DECISIONS = "decisions"
    DRAFTS = "drafts"
    EVENTS = "events"
    RUN_COUNTS = "run_counts"  # the per-run counters the reports read (verify.py)
    # the tables only an export holds (store/audit_file.py)
    BODIES = "bodies"
    SUPPRESSIONS = "suppressions"
    SUPPRESSION_AUDIT = "suppression_audit"
    MANIFEST = "manifest"
    SEAL = "seal"


class Change(StrEnum):
    DIFFERS = "differs"  # the row is stored, one column is not what the events say
    MISSING = "missing"  # the events made the row; it is not stored
    EXTRA = "extra"  # the row is stored; no event made it
    ILLEGAL = "illegal"  # an event makes a move the state machine does not allow


@dataclass(frozen=True)
class Difference:
    """One row that is not what it should be: which, how, and the two values (`expected`:
    what the events replayed, or the chain, say it should hold)."""

    table: Table
    row: str  # names the row: "item k2 (seq 2)", "attempt 1 of item k2 (seq 2)", "event 7"
    change: Change
    column: str | None = None
    stored: Any = None
    expected: Any = None


# ---------------------------------------------------------------- the rebuild


@dataclass(slots=True)
class _Item:
    """One item as its events rebuild it: mutable while they replay (a frozen record copied
    at every move would cost more than the rest of the replay), read as an ItemRecord."""

    seq: int
    item_id: str
    state: str = ItemState.PENDING.value
    attempts: int = 0
    receipt_id: str | None = None
    last_error: str | None = None
    next_attempt_at: str | None = None
    rows: list[AttemptRecord] = field(default_factory=list)  # its attempt rows
    # Its start time as planned and as the last claim that found its window closed moved it
    # (`reopened`), where one did.
    reopened: bool = False
    planned_start: Any = None
    start: str | None = None

    @property
    def record(self) -> ItemRecord:
        return ItemRecord(self.seq, self.item_id, self.state, self.attempts, self.receipt_id,
                          self.last_error, self.next_attempt_at)  # fmt: skip


@dataclass
class Rebuilt:
    """What the events say the rows are."""

    state: str
    items: dict[int, _Item]
    receipts: dict[int, ReceiptRecord]
    decisions: list[DecisionRecord]
    planned: int | None  # how many items the plan (or the freeze) stored
    illegal: list[Difference]
    fingerprint: str | None = None  # the last one chained; None: no event records one
    approval: Any = None  # the approval record, parsed, as the last event that set it left it
    inputs: str | None = None  # a --compose run's DraftingInputs digest, chained at its plan
    identities: str | None = None  # intent.Identities of the items, as last chained
    schedules: dict[str, str] | None = None  # intent.Schedules of the items, as last chained
    drafts: dict[int, str] = field(default_factory=dict)  # each row's last draft digest
    # (seq, the start time a claim found, the one the item's last move left it): another
    # start time written in between, by nothing that chained it.
    unmoved_starts: list[tuple[int, Any, str]] = field(default_factory=list)
    # Why the run stopped, as its last move that wrote it left it (STOP_COLUMNS).
    stop: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(STOP_COLUMNS))


def replay(items: Iterable[tuple[int, str]], events: Iterable[EventRecord]) -> Rebuilt:
    """The rows rebuilt from `events`, for the run's items (seq, item_id), each planned
    pending with no attempt. Each item's events in seq_no order, and the run's own in
    theirs: an item's rows follow from its own events alone, so items may come one after
    another or interleaved."""
    rebuilt = Rebuilt(
        state=RunState.PLANNED.value,
        items={seq: _Item(seq, item_id) for seq, item_id in items},
        receipts={},
        decisions=[],
        planned=None,
        illegal=[],
    )
    for event in events:
        detail = _detail(event)
        if event.kind.startswith(_RUN_EVENT):
            _run_move(rebuilt, event, detail)
        elif event.kind in _PLAN_EVENTS:
            _plan_event(rebuilt, event, detail)
        elif event.item_seq is not None:
            _item_event(rebuilt, event, detail)
    return rebuilt


def _item_event(rebuilt: Rebuilt, event: EventRecord, detail: Mapping[str, Any]) -> None:
    """An event of one item (or row): its move, a decision by hand, a draft stored."""
    seq = event.item_seq
    assert seq is not None
    if event.kind == EventKind.DECISION:
        operator, decision, evidence = (
            detail.get(name) for name in ("operator", "decision", "evidence")
        )
        if isinstance(operator, str) and isinstance(decision, str) and isinstance(evidence, str):
            rebuilt.decisions.append(DecisionRecord(seq, operator, event.at, decision, evidence))
        else:
            _illegal(rebuilt, event, "detail")
        if "last_error" in detail:  # an abandoned item marked not sent (no move)
            _released(rebuilt, event, detail["last_error"])
    elif event.kind == EventKind.FAILED_AT_FREEZE:
        _apply(rebuilt, event, detail, ItemState.FAILED.value)
    elif event.kind == EventKind.REOPENED:
        _reopened(rebuilt, event, detail)
    elif event.kind in _TRIGGERS:
        _item_move(rebuilt, event, detail)
    elif event.kind in (EventKind.DRAFTED, EventKind.REDRAFTED):
        draft = detail.get("draft")
        if isinstance(draft, str):
            rebuilt.drafts[seq] = draft
        elif "draft" in detail:
            _illegal(rebuilt, event, "detail")
        if event.kind == EventKind.REDRAFTED:
            _replanned(rebuilt, event)


def _released(rebuilt: Rebuilt, event: EventRecord, last_error: Any) -> None:
    """An abandoned item marked not sent (store/ledger.py release_abandoned): still failed,
    with the last error its decision records."""
    item = rebuilt.items.get(event.item_seq) if event.item_seq is not None else None
    if item is None:
        return  # the item is in another slice's replay
    if item.state != ItemState.FAILED or not isinstance(last_error, str):
        _illegal(rebuilt, event, "state", item.state, event.kind)
        return
    item.last_error = last_error


def _reopened(rebuilt: Rebuilt, event: EventRecord, detail: Mapping[str, Any]) -> None:
    """A claim found a pending item's window closed and gave it the window's next opening as
    its start time (store/waiting.py keep_open): `from` the start time it found, `to` the
    one it wrote. No state moves."""
    item = rebuilt.items.get(event.item_seq) if event.item_seq is not None else None
    if item is None:
        _illegal(rebuilt, event, "item_seq", None, event.item_seq)
        return
    # `from` is whatever the claim found stored (an editor's value too, which the plan's
    # digest then names); `to` is always a time the claim wrote.
    found, to = detail.get("from"), detail.get("to")
    if not isinstance(to, str):
        _illegal(rebuilt, event, "detail")
        return
    if item.state != ItemState.PENDING:
        _illegal(rebuilt, event, "state", item.state, event.kind)
        return
    if not item.reopened:
        item.reopened, item.planned_start = True, found
    elif found != item.start:
        rebuilt.unmoved_starts.append((item.seq, found, str(item.start)))
    item.start = to


def _replanned(rebuilt: Rebuilt, event: EventRecord) -> None:
    """A redraft plans its row again (store/drafts.py REDRAFT_ITEM): pending or failed, never
    attempted, to pending with no error."""
    item = rebuilt.items.get(event.item_seq) if event.item_seq is not None else None
    if item is None:
        return  # the row's item is in another slice's replay, or it was never planned
    if item.state not in (ItemState.PENDING, ItemState.FAILED) or item.attempts:
        _illegal(rebuilt, event, "state", item.state, event.kind)
        return
    item.state, item.last_error = ItemState.PENDING.value, None


def _illegal(
    rebuilt: Rebuilt, event: EventRecord, column: str, stored: Any = None, expected: Any = None
) -> None:
    """Name `event` as one no version of notifier wrote (a move its state does not allow, an
    item the run lacks, a detail without what its kind always records), rather than
    replay it."""
    rebuilt.illegal.append(
        Difference(Table.EVENTS, f"event {event.seq_no}", Change.ILLEGAL, column, stored, expected)
    )


def _detail(event: EventRecord) -> dict[str, Any]:
    if not event.detail:
        return {}
    try:
        value = json.loads(event.detail)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_PLAN_EVENTS = frozenset(
    (EventKind.PLANNED, EventKind.FROZEN, EventKind.REDRAFT, EventKind.APPROVAL_RENEWED)
)


def _plan_event(rebuilt: Rebuilt, event: EventRecord, detail: Mapping[str, Any]) -> None:
    """What the run's plan holds: how many items a plan or a freeze stored, the fingerprint
    it (or a redraft) chained, its approval renewed or cleared."""
    if event.kind == EventKind.APPROVAL_RENEWED:
        rebuilt.approval = detail
        return
    if "schedules" in detail:  # absent from events written before schedules were chained
        schedules = detail["schedules"]
        if isinstance(schedules, dict) and all(isinstance(v, str) for v in schedules.values()):
            rebuilt.schedules = schedules
        else:
            _illegal(rebuilt, event, "detail")
    if event.kind == EventKind.REDRAFT:
        rebuilt.approval = None  # a redraft clears the approval (store/drafts.py)
    elif "items" in detail:
        if isinstance(detail["items"], int):
            rebuilt.planned = detail["items"]
        else:
            _illegal(rebuilt, event, "detail")
    # Digests chained by a plan, a freeze or a redraft; each absent from events written
    # before it was chained: the items' ids and keys, a --compose run's inputs, the
    # fingerprint.
    for name in ("identities", "inputs", "fingerprint"):
        if name in detail:
            if isinstance(detail[name], str):
                setattr(rebuilt, name, detail[name])
            else:
                _illegal(rebuilt, event, "detail")


def _run_move(rebuilt: Rebuilt, event: EventRecord, detail: Mapping[str, Any]) -> None:
    """The run's move, and the approval it wrote: the column's JSON text, or null."""
    try:
        trigger = RunTrigger(event.kind[len(_RUN_EVENT) :])
        rebuilt.state = run_next(trigger, RunState(rebuilt.state)).value
    except (ValueError, IllegalMove):
        _illegal(rebuilt, event, "kind", rebuilt.state, event.kind)
    for column in STOP_COLUMNS:
        if column in detail:
            rebuilt.stop[column] = detail[column]
    if "approval" in detail:
        approval = detail["approval"]
        try:
            rebuilt.approval = None if approval is None else json.loads(approval)
        except (TypeError, ValueError):
            _illegal(rebuilt, event, "detail")


def _item_move(rebuilt: Rebuilt, event: EventRecord, detail: Mapping[str, Any]) -> None:
    seq = event.item_seq
    item = rebuilt.items.get(seq) if seq is not None else None
    if item is None:
        _illegal(rebuilt, event, "item_seq", None, seq)
        return
    kind = event.kind
    target = item_target(kind, item.state)
    if target is None:
        _illegal(rebuilt, event, "state", item.state, kind)
        target = str(detail.get("to", item.state))
    if kind == ItemTrigger.RELEASE and item.state == ItemState.IN_FLIGHT and item.attempts:
        # Claimed but never started: not counted as an attempt (ledger UNCOUNT_ATTEMPT).
        item.attempts -= 1
    if kind == ItemTrigger.START:
        _open_attempt(rebuilt, item, event)
    _apply(rebuilt, event, detail, target)


def _open_attempt(rebuilt: Rebuilt, item: _Item, event: EventRecord) -> None:
    """The claim's attempt row (ledger._claim): numbered after the item's rows, with how
    long it waited since the last one finished, if the item had any attempt counted."""
    at = event.at
    waited = None
    if item.attempts and item.rows and item.rows[-1].finished_at:
        try:
            waited = (parse(at) - parse(item.rows[-1].finished_at)).total_seconds()
        except (ValueError, TypeError):  # a time no version of notifier wrote
            _illegal(rebuilt, event, "at")
    n = len(item.rows) + 1
    item.rows.append(AttemptRecord(item.seq, n, at, None, None, None, None, None, waited))
    item.attempts += 1
    item.next_attempt_at = None


def _apply(rebuilt: Rebuilt, event: EventRecord, detail: Mapping[str, Any], target: str) -> None:
    """The move to `target` and what the event says it wrote with it."""
    seq = event.item_seq
    assert seq is not None
    item = rebuilt.items.get(seq)
    if item is None:
        _illegal(rebuilt, event, "item_seq", None, seq)
        return
    item.state = target
    sets = detail.get("set")
    if isinstance(sets, dict):  # the detail is parsed JSON: its objects are dicts
        for column, value in sets.items():
            if column in ITEM_COLUMNS:
                setattr(item, column, value)
    closed = detail.get("attempt")
    if isinstance(closed, dict):
        for n, a in enumerate(item.rows):
            if a.finished_at is None:
                item.rows[n] = AttemptRecord(
                    a.seq,
                    a.n,
                    closed.get("started_at") or a.started_at,
                    closed.get("finished_at"),
                    closed.get("outcome"),
                    closed.get("http_status"),
                    closed.get("error"),
                    closed.get("retry_after_s"),
                    a.waited_s,
                )
    receipt = detail.get("receipt")
    if isinstance(receipt, dict):
        rebuilt.receipts[seq] = ReceiptRecord(
            seq, receipt.get("id"), str(receipt.get("source")), receipt.get("evidence"), event.at
        )


# ---------------------------------------------------------------- the comparison


def compare_run(
    rebuilt: Rebuilt,
    run: Mapping[str, Any],
    items: int,
    decisions: Sequence[DecisionRecord],
) -> list[Difference]:
    """The run's own row (`run`: its state, fingerprint and approval as stored) against the
    replay of its own events, with how many items it holds and each decision by hand."""
    found: list[Difference] = list(rebuilt.illegal)
    if run["state"] != rebuilt.state:
        found.append(Difference(Table.RUNS, "the run", Change.DIFFERS, "state", run["state"],
                                rebuilt.state))  # fmt: skip
    if rebuilt.fingerprint is not None and run["fingerprint"] != rebuilt.fingerprint:
        found.append(Difference(Table.RUNS, "the run", Change.DIFFERS, "fingerprint",
                                run["fingerprint"], rebuilt.fingerprint))  # fmt: skip
    approval = json_value(run["approval"])
    if approval != rebuilt.approval:
        found.append(Difference(Table.RUNS, "the run", Change.DIFFERS, "approval", approval,
                                rebuilt.approval))  # fmt: skip
    if rebuilt.planned is not None and rebuilt.planned != items:
        found.append(Difference(Table.ITEMS, "the run's items", Change.DIFFERS, "count", items,
                                rebuilt.planned))  # fmt: skip
    found += _rows(
        Table.DECISIONS,
        dict(enumerate(decisions, start=1)),
        dict(enumerate(rebuilt.decisions, start=1)),
        lambda n: f"decision {n}",
    )
    return found


def compare_stop(
    rebuilt: Rebuilt, stored: Mapping[str, Any] | None, items: int
) -> list[Difference]:
    """Why the run stopped (`stored`: the STOP_COLUMNS at hand, an export holds no cause;
    None: not at hand) against what the last move that wrote it chained: a rejection's
    reviewer or reason, or a cancel passed off as a reviewer's rejection, rewritten. The
    one reason written without an event, a pause's count of items of unknown outcome, is
    brought down to date as a reconcile settles them (api/settling.py complete_if_done):
    a lower count (the run has `items`), or none (then no cause either), holds for a run
    whose move paused it so."""
    if stored is None or (
        rebuilt.stop["stop_cause"] == StopCause.UNKNOWN_LEFT
        and _settled(stored, rebuilt.stop["stop_reason"], items)
    ):
        return []
    return [
        Difference(Table.RUNS, "the run", Change.DIFFERS, column, stored[column],
                   rebuilt.stop[column])
        for column in STOP_COLUMNS
        if column in stored and stored[column] != rebuilt.stop[column]
    ]  # fmt: skip


def _settled(stored: Mapping[str, Any], paused: Any, items: int) -> bool:
    """Whether a pause for unknown outcomes (`paused`: the reason it chained) reads as a
    reconcile leaves it: cleared (reason and cause), or counting fewer items with its cause.
    The counts are written out as the pause writes them, from 1 up to the one it chained,
    never read back from the text."""
    reason = stored.get("stop_reason")
    cause = stored.get("stop_cause", StopCause.UNKNOWN_LEFT.value if reason else None)
    if reason is None:
        return cause is None
    if cause != StopCause.UNKNOWN_LEFT:
        return False
    for count in range(1, items + 1):
        written = unknown_left_reason(count)
        if written == reason:
            return True
        if written == paused:
            return False  # a count above the one the pause chained
    return False


def json_value(text: str | None) -> Any:
    """A JSON column's value, or its text where it is not JSON (then it differs from any
    record an event holds)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def compare_intents(intents: Iterable[IntentRecord], names: Mapping[int, str]) -> list[Difference]:
    """Every item whose stored digest is not the one its channel, target and payload hash
    to now (where its payload is at hand)."""
    found: list[Difference] = []
    for intent in intents:
        if intent.payload is None:
            continue
        payload: Any = None
        try:
            payload = json.loads(intent.payload)
            own = intent_digest(intent.channel, intent.target, payload)
        except (TypeError, ValueError, AttributeError):
            own = None  # not a payload notifier wrote: no digest is its own
        name = names.get(intent.seq, f"item seq {intent.seq}")
        if own != intent.intent_digest:
            found.append(Difference(Table.ITEMS, name, Change.DIFFERS, "intent_digest",
                                    intent.intent_digest, own))  # fmt: skip
        elif intent.deadline_at_hand and isinstance(payload, dict):
            # The deadline the engine expires it by must be the one its digest covers: else
            # it would be sent after its approved deadline, or expire unsent before it.
            deadline = payload.get("not_after")
            if intent.not_after != deadline:
                found.append(Difference(Table.ITEMS, name, Change.DIFFERS, "not_after",
                                        intent.not_after, deadline))  # fmt: skip
    return found


# The states of a --compose row the freeze plans as failed or leaves out: every other row's
# draft is made into its notification (content/compose.py freeze), so every other is checked.
UNDRAFTED = frozenset(("pending", "failed"))


def compare_drafts(
    drafts: Iterable[DraftRecord], chained: Mapping[int, str], *, every_draft_chained: bool
) -> list[Difference]:
    """Every row the freeze would make a notification of whose draft does not hash to the
    digest chained when it was stored; with `every_draft_chained` (a run whose plan chained
    its inputs, so each of its drafts was chained too), also every such row with none."""
    found: list[Difference] = []
    for draft in drafts:
        if draft.state in UNDRAFTED:
            continue
        expected = chained.get(draft.seq)
        if expected is None and not every_draft_chained:
            continue  # drafted before drafts were chained
        own = draft_digest(draft.subject, draft.body)
        if own != expected:
            found.append(Difference(Table.DRAFTS, f"draft of row {draft.seq}", Change.DIFFERS,
                                    "draft", own, expected))  # fmt: skip
    return found


def compare_items(rebuilt: Rebuilt, stored: RunRows) -> list[Difference]:
    """Every stored item, attempt and receipt of these items that is not what their events
    say, and every such row the events made that is not stored: each named, with the column
    and both values where one differs."""
    names = {item.seq: f"item {item.item_id} (seq {item.seq})" for item in stored.items}
    found: list[Difference] = list(rebuilt.illegal)
    found += _rows(
        Table.ITEMS,
        {i.seq: i for i in stored.items},
        {seq: item.record for seq, item in rebuilt.items.items()},
        lambda seq: names.get(seq, f"item seq {seq}"),
    )
    replayed_attempts = {(a.seq, a.n): a for item in rebuilt.items.values() for a in item.rows}
    found += _rows(
        Table.ATTEMPTS,
        {(a.seq, a.n): a for a in stored.attempts},
        replayed_attempts,
        lambda key: f"attempt {key[1]} of {names.get(key[0], f'item seq {key[0]}')}",
    )
    found += _rows(
        Table.RECEIPTS,
        {r.seq: r._replace(intent_digest=None) for r in stored.receipts},
        rebuilt.receipts,
        lambda seq: f"receipt of {names.get(seq, f'item seq {seq}')}",
    )
    found += compare_intents(stored.intents, names)
    found += _compare_starts(rebuilt, stored.intents, names)
    return found


def _compare_starts(
    rebuilt: Rebuilt, intents: Iterable[IntentRecord], names: Mapping[int, str]
) -> list[Difference]:
    """Every item a claim gave a later start time whose start time is not the one its last
    such move wrote, or was not the one it left when a claim found it. (Where no claim
    moved it, its start time is checked with its window and zone against the digest the
    plan chained: verify.py.)"""
    found: list[Difference] = []
    for seq, was, expected in rebuilt.unmoved_starts:
        found.append(Difference(Table.ITEMS, names.get(seq, f"item seq {seq}"), Change.DIFFERS,
                                "not_before", was, expected))  # fmt: skip
    for intent in intents:
        item = rebuilt.items.get(intent.seq)
        if item is None or not item.reopened or not intent.schedule_at_hand:
            continue
        if intent.not_before != item.start:
            found.append(Difference(Table.ITEMS, names.get(intent.seq, f"item seq {intent.seq}"),
                                    Change.DIFFERS, "not_before", intent.not_before,
                                    item.start))  # fmt: skip
    return found


def _rows(
    table: Table, stored: Mapping[Any, Any], replayed: Mapping[Any, Any], name: Any
) -> list[Difference]:
    found: list[Difference] = []
    for key in sorted(set(stored) | set(replayed)):
        mine, theirs = stored.get(key), replayed.get(key)
        if theirs is None:
            found.append(Difference(table, name(key), Change.EXTRA))
        elif mine is None:
            found.append(Difference(table, name(key), Change.MISSING))
        elif mine != theirs:  # records of one kind: equal field by field
            for column, a, b in zip(mine._fields, mine, theirs, strict=True):
                if a != b:
                    found.append(Difference(table, name(key), Change.DIFFERS, column, a, b))
    return found
