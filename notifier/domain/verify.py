"""`notifier verify`'s check of a run: its chain of events (chain.py), with the audit key
where one is given, and its rows against their replay (replay.py). Pure: the run comes as
plain records from an AuditSource (the live store's store/audit.py today; an exported file
can give the same records), and the verdict is a record the command layer renders.

What each verdict means (docs/guarantees.md has the threat model):
- keyed: every link checked with the run's key, and every row is what the events say;
- unkeyed: checked without a key (a run chained without one, or a keyed run verified
  without its key: then only the links' order), so it shows accidents, not an editor;
- unsigned: planned before the chain existed; there is nothing to check it against;
- altered: something was named: an event missing, edited, inserted or moved, a chain
  keyed with another key (or not keyed at all when a key is given), a row that differs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from itertools import pairwise
from typing import Any, Protocol

from notifier.domain.chain import UNKEYED, ChainKind, Signer
from notifier.domain.intent import (
    DraftingInputs,
    Fingerprinting,
    Identities,
    Schedules,
    intent_digest,
    nfc,
    stored_row_digest,
)
from notifier.domain.replay import (
    Change,
    DecisionRecord,
    Difference,
    EventRecord,
    IntentRecord,
    RunRows,
    Table,
    compare_drafts,
    compare_items,
    compare_run,
    compare_stop,
    json_value,
    replay,
)


class AuditVerdict(StrEnum):
    KEYED = "keyed"
    UNKEYED = "unkeyed"
    UNSIGNED = "unsigned"
    ALTERED = "altered"


@dataclass(frozen=True)
class RunHead:
    """What verify reads of a run before its rows: how its events are chained, its state,
    how many items it holds, when it was planned, since when the database chains every
    new run (when m013 was applied to it; None where that is not recorded), and what its
    approval covers: its fingerprint, its approval record and its channel snapshot (JSON
    text; None in an audit file exported before files held it); and, for a --compose run,
    what its intents are made of besides its drafts: its options (JSON text, holding its
    template) and its key nonce."""

    run_id: str
    chain: str | None  # ChainKind's value; None: planned before the chain
    key_id: str | None
    state: str
    items: int
    created_at: str
    chained_since: str | None
    fingerprint: str
    approval: str | None
    channel_snapshot: str | None
    options: str | None = None
    key_nonce: str | None = None
    # The run's per-run counters (state → n) that status, report, runs and metrics read
    # instead of its rows; None where none are kept (an export, a file before m004).
    counted: Mapping[str, int] | None = None
    # Whether a plain row without an id is identified by its row digest (m021 applied):
    # before, by its intent digest, its deadline and line breaks included.
    rows_by_row_digest: bool = True
    # Why the run stopped, as stored (replay.STOP_COLUMNS: the prose and its cause; an
    # export holds the prose alone); None where not at hand.
    stopped: Mapping[str, str | None] | None = None

    def chained_when_planned(self) -> bool:
        """Whether the run was planned after its database began chaining every run: then it
        cannot be unchained unless someone cleared its chain."""
        if self.chained_since is None:
            return False
        return datetime.fromisoformat(self.created_at) >= datetime.fromisoformat(self.chained_since)


class AuditSource(Protocol):
    """Where the runs to check are read from, read-only, a slice at a time: a run of a
    million items is checked in the memory of CHUNK of them."""

    def run_ids(self) -> list[str]: ...

    def reading(self) -> AbstractContextManager[None]:
        """One consistent view for the reads that follow (a snapshot of a live store)."""
        ...

    def head(self, run_id: str) -> RunHead | None: ...

    def events(self, run_id: str) -> Iterable[EventRecord]:
        """Every event of the run in seq_no order, streamed."""
        ...

    def run_events(self, run_id: str) -> list[EventRecord]:
        """The run's own events (no item_seq) and its manual decisions, in seq_no order."""
        ...

    def item_seqs(self, run_id: str) -> Iterable[int]:
        """The run's item seqs in order, and a --compose run's drafted rows' (one still
        drafting has no items), streamed: where its slices begin."""
        ...

    def item_events(self, run_id: str, seqs: range) -> list[EventRecord]:
        """The events of the items numbered in `seqs`, item by item, each item's in seq_no
        order (the order of the index they are read through: no sort)."""
        ...

    def rows(self, run_id: str, seqs: range) -> RunRows:
        """The stored items, attempts, receipts and intents of the items numbered in `seqs`,
        and a --compose run's rows (drafts) among them, None where not at hand (state: the
        run's; decisions: none, they are read whole)."""
        ...

    def decisions(self, run_id: str) -> list[DecisionRecord]: ...


# How many items are replayed and compared at once.
CHUNK = 5000


@dataclass(frozen=True)
class RunVerdict:
    run_id: str
    verdict: AuditVerdict
    chain: str | None
    key_id: str | None  # the run's, as recorded
    events: int
    findings: tuple[Difference, ...]


def verify(source: AuditSource, run_ids: Iterable[str], signer: Signer) -> list[RunVerdict]:
    """Each run's verdict (`signer`: the key given, or UNKEYED for none). KeyError for a
    run the source does not hold."""
    verdicts = []
    for run_id in run_ids:
        with source.reading():
            head = source.head(run_id)
            if head is None:
                raise KeyError(run_id)
            verdicts.append(verify_run(source, head, signer))
    return verdicts


def verify_run(source: AuditSource, head: RunHead, signer: Signer) -> RunVerdict:
    counted = _CountedEvents(source.events(head.run_id))
    findings = _chain(head, counted, signer)
    for _ in counted:  # what the chain check left unread, counted
        pass
    stripped = head.chain is None and head.chained_when_planned()
    if stripped:
        findings.append(
            Difference(Table.RUNS, "the run", Change.MISSING, "audit_chain", None,
                       "a chain: the run was planned after its database began chaining")
        )  # fmt: skip
    if head.chain is not None or stripped:
        # Runs from before the chain wrote events that do not say what each move wrote:
        # their replay would differ from every row without anything having been altered.
        findings += _replayed(source, head)
    if findings:
        verdict = AuditVerdict.ALTERED
    elif head.chain is None:
        verdict = AuditVerdict.UNSIGNED
    elif head.chain == ChainKind.KEYED and signer.key is not None:
        verdict = AuditVerdict.KEYED
    else:
        verdict = AuditVerdict.UNKEYED
    return RunVerdict(head.run_id, verdict, head.chain, head.key_id, counted.count,
                      tuple(findings))  # fmt: skip


class _CountedEvents:
    """The events as they stream past, counted."""

    def __init__(self, events: Iterable[EventRecord]) -> None:
        self._events = events
        self.count = 0

    def __iter__(self) -> Iterator[EventRecord]:
        for event in self._events:
            self.count += 1
            yield event


def _replayed(source: AuditSource, head: RunHead) -> list[Difference]:
    """The run replayed from its events and compared with its rows: the run's own moves and
    its decisions whole, its items CHUNK at a time."""
    run = replay((), source.run_events(head.run_id))
    stored = {"state": head.state, "fingerprint": head.fingerprint, "approval": head.approval}
    found = compare_run(run, stored, head.items, source.decisions(head.run_id))
    found += compare_stop(run, head.stopped, head.items)
    fingerprint, inputs, drafted = Fingerprinting(), DraftingInputs(), True
    identities, keys_at_hand = Identities(), True
    schedules = _PlannedSchedules()
    forms = _IdentityForms(head.rows_by_row_digest)
    receipts: list[Difference] = []
    states: Counter[str] = Counter()
    for seqs in slices(source.item_seqs(head.run_id), CHUNK):
        rows = source.rows(head.run_id, seqs)
        states.update(str(item.state) for item in rows.items)
        rebuilt = replay(((i.seq, i.item_id) for i in rows.items),
                         source.item_events(head.run_id, seqs))  # fmt: skip
        found += compare_items(rebuilt, rows)
        receipts += _receipted(rows)
        found += compare_drafts(rows.drafts or (), rebuilt.drafts,
                                every_draft_chained=run.inputs is not None)  # fmt: skip
        for intent in rows.intents:
            fingerprint.add(str(intent.intent_digest))  # what is stored, whatever it is
        for item, intent in zip(rows.items, rows.intents, strict=True):
            found += forms.add(str(item.item_id), item.seq, intent)
            replayed = rebuilt.items.get(item.seq)
            if replayed is not None and replayed.reopened:  # as the claim that moved it found it
                schedules.add(intent, replayed.planned_start)
            else:
                schedules.add(intent, intent.not_before)
            if intent.idempotency_key is None:
                keys_at_hand = False
            else:
                identities.add(str(item.item_id), str(intent.idempotency_key))
        if rows.drafts is None:
            drafted = False
        for draft in rows.drafts or ():
            inputs.add(str(draft.source))
    found += _covered(head, fingerprint)
    if not any(d.table is Table.RUNS and d.column == "fingerprint" for d in found):
        # The items' digests are the ones planned (the run's fingerprint holds): a receipt
        # of another digest is the row rewritten. Where an intent was rewritten, its
        # receipt still holds the digest delivered, and the fingerprint names the run.
        found += receipts
    if keys_at_hand and run.identities is not None and identities.result() != run.identities:
        # An item's id or key rewritten (or two rows' ids swapped) since they were stored.
        found.append(Difference(Table.ITEMS, "the run's items", Change.DIFFERS,
                                "item_id, idempotency_key", identities.result(),
                                run.identities))  # fmt: skip
    found += forms.mixed()
    found += schedules.differences(run.schedules)
    if drafted and run.inputs is not None:
        found += _drafted_from(head, inputs, run.inputs)
    found += _counters(head, states)
    return found


class _IdentityForms:
    """Each item's row identity (items.identity: what `send` compares the rows of a later
    file with) against what its plan made of the item: `id:` and its id (in NFC, or as
    written before m019) when its file had an id column, else its content's digest (its
    row digest, intent.row_digest; a --compose row's source digest). One rewritten would
    make the next send of the file deliver the row again, or leave it out as delivered. A
    file has an id column or not, so a run's items are all of one form: an item of the other form is
    named too (a few of them, where a run mixes them)."""

    NAMED = 20

    def __init__(self, by_row_digest: bool = True) -> None:
        self.by_row_digest = by_row_digest
        self.counts: Counter[str] = Counter()
        self.names: dict[str, list[str]] = {"id": [], "content": []}

    def add(self, item_id: str, seq: int, intent: IntentRecord) -> list[Difference]:
        identity = intent.identity
        if identity is None:
            return []  # not at hand (an export, a database before m006)
        # An id no notifier wrote (not UTF-8, read back as surrogates) shown escaped: a
        # finding's row is printed as it is.
        shown = item_id.encode("utf-8", "backslashreplace").decode("utf-8")
        name = f"item {shown} (seq {seq})"
        if identity in ("id:" + nfc(item_id), "id:" + item_id):
            form = "id"
            if (row_digest := _row_digest_problem(intent)) is not None:
                return [Difference(Table.ITEMS, name, Change.DIFFERS, "row_digest",
                                   intent.row_digest, row_digest)]  # fmt: skip
        elif identity == _content_identity(intent) or (
            # A database m021 has not moved yet (verify migrates nothing): a plain row's
            # identity is its intent digest, as its version wrote it.
            not self.by_row_digest
            and intent.source_digest is None
            and identity == intent.intent_digest
        ):
            form = "content"
        else:
            return [Difference(Table.ITEMS, name, Change.DIFFERS, "identity", identity,
                               "id:" + nfc(shown))]  # fmt: skip
        self.counts[form] += 1
        if len(self.names[form]) < self.NAMED:
            self.names[form].append(name)
        return []

    def mixed(self) -> list[Difference]:
        if len(self.counts) < 2:
            return []
        fewer = min(self.counts, key=lambda form: (self.counts[form], form))
        return [Difference(Table.ITEMS, name, Change.DIFFERS, "identity", fewer,
                           "the form of the run's other items")
                for name in self.names[fewer]]  # fmt: skip


class _PlannedSchedules:
    """The items' schedules as planned (intent.Schedules), against the digest their plan (or
    freeze) chained: a start time, window or zone rewritten changes when the engine sends
    an item, and no intent digest covers them. A start time a claim moved (`reopened`,
    replay.py checks the item's against its last move) counts as the one that move found."""

    def __init__(self) -> None:
        self.digest = Schedules()
        self.at_hand = True  # every item's schedule read (not in an export, nor before m009)

    def add(self, intent: IntentRecord, start: Any) -> None:
        """`intent`'s schedule, `start` its start time as planned."""
        if not intent.schedule_at_hand:
            self.at_hand = False
            return
        self.digest.add(*(None if value is None else str(value)
                          for value in (start, intent.send_window, intent.send_tz)))  # fmt: skip

    def differences(self, chained: Mapping[str, str] | None) -> list[Difference]:
        if chained is None or not self.at_hand:
            return []  # planned before schedules were chained, or not read
        own = self.digest.result()
        return [
            Difference(Table.ITEMS, "the run's items", Change.DIFFERS, column, own[column],
                       chained.get(column))
            for column in Schedules.COLUMNS
            if own[column] != chained.get(column)
        ]  # fmt: skip


def _row_digest_problem(intent: IntentRecord) -> str | None:
    """The row digest a plain item with an id should be compared under (intent.row_digest),
    where the one kept is another: rewritten, a later file of its content without ids and
    with another deadline would be new rows, sent again. None where it is right or not at
    hand (a composed item is compared through its draft's source digest)."""
    if intent.row_digest is None or intent.payload is None or intent.source_digest is not None:
        return None
    try:
        expected = intent.intent_digest
        if '"not_after":' in intent.payload or "\\r" in intent.payload:
            # A deadline to leave out or a `\r` to rewrite (JSON-escaped), as make_plan
            # finds them: elsewhere the row digest is the intent digest.
            expected = stored_row_digest(intent.channel, intent.target, intent.payload)
        if intent.row_digest == expected:
            return None
        own = intent_digest(intent.channel, intent.target, json.loads(intent.payload))
    except (TypeError, ValueError, AttributeError, KeyError):
        return None  # not a payload notifier wrote: compare_intents names it
    # An intent rewritten (its target or payload) is named as that, by compare_intents.
    return expected if own == intent.intent_digest else None


def _content_identity(intent: IntentRecord) -> str:
    """The identity a row without an id has: a composed row's source digest; else its row
    digest (its intent digest for a row without a deadline or a `\r`; m021 moved the
    others), or its intent digest where its payload is not at hand (an export without
    bodies)."""
    if intent.source_digest is not None:
        return intent.source_digest
    if intent.payload is None:
        return intent.intent_digest
    return stored_row_digest(intent.channel, intent.target, intent.payload)


def _receipted(rows: RunRows) -> list[Difference]:
    """Every receipt whose intent digest is not its item's: the receipt is stored with a
    copy of it, and every open of the store refuses a sent item's receipt of another (a
    record claiming another notification delivered)."""
    items = {item.seq: item for item in rows.items}
    digests = {intent.seq: intent.intent_digest for intent in rows.intents}
    found = []
    for receipt in rows.receipts:
        own = digests.get(receipt.seq)
        if receipt.intent_digest is None or own is None or receipt.intent_digest == own:
            continue
        name = f"receipt of item {items[receipt.seq].item_id} (seq {receipt.seq})"
        found.append(Difference(Table.RECEIPTS, name, Change.DIFFERS, "intent_digest",
                                receipt.intent_digest, own))  # fmt: skip
    return found


def _counters(head: RunHead, states: Mapping[str, int]) -> list[Difference]:
    """The run's counters (what every report counts) against its item rows, state by
    state: a counter rewritten behind the rows would make the reports say what the rows,
    checked against the events, do not."""
    if head.counted is None:
        return []
    counted = head.counted
    return [
        Difference(
            Table.RUN_COUNTS,
            f"the run's {state} count",
            Change.DIFFERS,
            "n",
            counted.get(state, 0),
            states.get(state, 0),
        )
        for state in sorted(set(counted) | set(states))
        if counted.get(state, 0) != states.get(state, 0)
    ]


def _drafted_from(head: RunHead, inputs: DraftingInputs, chained: str) -> list[Difference]:
    """A --compose run's sources, template, channel snapshot and key nonce against the
    digest its plan chained: one rewritten while the run drafted (before its freeze made
    intents of it) is named."""
    own = inputs.result(json_value(head.options), json_value(head.channel_snapshot), head.key_nonce)
    if own == chained:
        return []
    return [Difference(Table.DRAFTS, "the run's rows", Change.DIFFERS, "inputs", own, chained)]


def _covered(head: RunHead, digests: Fingerprinting) -> list[Difference]:
    """The run's fingerprint against the one its stored digests and channel snapshot hash
    to (what an approval is checked against): a digest, or the snapshot, rewritten since
    the plan. Not for a run still drafting (no fingerprint yet), nor where the snapshot is
    not at hand."""
    if head.fingerprint == "" or head.channel_snapshot is None:
        return []
    snapshot = json_value(head.channel_snapshot)
    own = digests.result(snapshot) if isinstance(snapshot, dict) else None
    if own == head.fingerprint:
        return []
    return [Difference(Table.RUNS, "the run", Change.DIFFERS, "fingerprint", head.fingerprint,
                       own)]  # fmt: skip


# Past any seq a run can hold: the first slice begins below every item, the last ends above,
# so an event naming an item no row holds is replayed (and named) with its neighbours.
_FAR = 2**62


def slices(seqs: Iterable[int], size: int) -> list[range]:
    """Ranges of item seqs that cover every integer, each holding `size` of the run's items
    (`seqs`, in order): as many slices as the items fill, whatever numbers events name."""
    starts = [seq for n, seq in enumerate(seqs) if n % size == 0 and n]
    bounds = [-_FAR, *starts, _FAR]
    return [range(lo, hi) for lo, hi in pairwise(bounds)]


def _chain(run: RunHead, events: Iterable[EventRecord], signer: Signer) -> list[Difference]:
    """Every event that breaks the run's chain, named; and a key that is not the run's."""
    if run.chain is None:
        # Unsigned: nothing was chained, so a hash here was put there by someone else.
        return [
            Difference(Table.EVENTS, f"event {e.seq_no}", Change.EXTRA, "hash", e.hash, None)
            for e in events
            if e.hash is not None or e.prev_hash is not None
        ]
    found: list[Difference] = []
    try:
        kind = ChainKind(run.chain)
    except ValueError:
        return [
            Difference(
                Table.RUNS,
                "the run",
                Change.DIFFERS,
                "audit_chain",
                run.chain,
                "one of " + ", ".join(k.value for k in ChainKind),
            )
        ]
    link: Signer | None = None  # what checks each link; None: only their order
    if kind is ChainKind.UNKEYED:
        link = UNKEYED
        if signer.key is not None:
            found.append(
                Difference(
                    Table.RUNS,
                    "the run",
                    Change.DIFFERS,
                    "audit_chain",
                    run.chain,
                    ChainKind.KEYED.value,
                )
            )
    elif signer.key is not None:
        if signer.key_id == run.key_id:
            link = signer
        else:
            found.append(
                Difference(
                    Table.RUNS, "the run", Change.DIFFERS, "audit_key_id", run.key_id, signer.key_id
                )
            )
    found += _links(events, link)
    return found


def _links(events: Iterable[EventRecord], link: Signer | None) -> list[Difference]:
    found: list[Difference] = []
    expected_no, prev = 1, None
    for e in events:
        for missing in range(expected_no, e.seq_no):
            found.append(Difference(Table.EVENTS, f"event {missing}", Change.MISSING))
        expected_no = e.seq_no + 1
        if e.prev_hash != prev:
            found.append(
                Difference(
                    Table.EVENTS,
                    f"event {e.seq_no}",
                    Change.DIFFERS,
                    "prev_hash",
                    e.prev_hash,
                    prev,
                )
            )
        if link is not None:
            own = link.link(e.prev_hash, e.run_id, e.seq_no, e.kind, e.item_seq, e.detail, e.at)
            if e.hash != own:
                found.append(
                    Difference(
                        Table.EVENTS, f"event {e.seq_no}", Change.DIFFERS, "hash", e.hash, own
                    )
                )
        elif e.hash is None:
            found.append(Difference(Table.EVENTS, f"event {e.seq_no}", Change.MISSING, "hash"))
        prev = e.hash
    return found
