"""What verify.py reads of a run (its head, its chained events, its rows a slice of items at a
time), as the plain records of replay.py: the checks never see the store's internals, so an
exported file can be read into the same records and checked the same way."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager

from notifier.domain.replay import (
    AttemptRecord,
    DecisionRecord,
    DraftRecord,
    EventRecord,
    IntentRecord,
    ItemRecord,
    ReceiptRecord,
    RunRows,
)
from notifier.domain.verify import RunHead
from notifier.store import migrations
from notifier.store.core import Core

_RUN = (
    "SELECT run_id, state, created_at, fingerprint, approval, channel_snapshot, options, "
    "{nonce}, {chain}, stop_reason, {cause} FROM runs WHERE run_id = %(run_id)s"
)
_RUN_IDS = "SELECT run_id FROM runs ORDER BY created_at, run_id"
_COUNT = "SELECT COUNT(*) FROM items WHERE run_id = %(run_id)s"
_COUNTERS = "SELECT state, n FROM run_counts WHERE run_id = %(run_id)s"
_SEQS = "SELECT seq FROM items WHERE run_id = %(run_id)s ORDER BY seq"
# A --compose run's rows too: one still drafting has drafts and no items, and is checked a
# slice of them at a time all the same.
_SEQS_AND_DRAFTS = (
    "SELECT seq FROM items WHERE run_id = %(run_id)s UNION "
    "SELECT seq FROM drafts WHERE run_id = %(run_id)s ORDER BY seq"
)
_APPLIED_AT = "SELECT applied_at FROM {table} WHERE name = '{name}'"
_CHAIN = "m013_event_chain"
# Since when a plain row without an id is identified by its row digest.
_ROW_DIGESTS = "m021_rows_without_ids_by_their_row_digest"
_IN = "run_id = %(run_id)s AND {seq} >= %(lo)s AND {seq} < %(hi)s"
# An item's record (ItemRecord's columns) and then its intent's (IntentRecord's, after seq).
_ITEMS = (
    "SELECT seq, item_id, state, attempts, receipt_id, last_error, next_attempt_at, "
    "channel, target, payload, intent_digest, idempotency_key, {identity}, {source}, "
    "{row_digest} AS row_digest, {deadline}, {schedule} "
    f"FROM items WHERE {_IN.format(seq='seq')} "
    "ORDER BY seq"
)
# A composed row's source digest (m018), beside its item.
_SOURCE = (
    "(SELECT d.source_digest FROM drafts AS d WHERE d.run_id = items.run_id AND d.seq = items.seq)"
)
_ITEM_FIELDS = len(ItemRecord._fields)
# A --compose run's rows (drafts) in a slice of seqs.
_DRAFTS = (
    "SELECT seq, state, source, subject, body FROM drafts "
    f"WHERE {_IN.format(seq='seq')} ORDER BY seq"
)
_ATTEMPTS = (
    "SELECT seq, n, started_at, finished_at, outcome, http_status, error, retry_after_s, "
    f"waited_s FROM attempts WHERE {_IN.format(seq='seq')} ORDER BY seq, n"
)
_RECEIPTS = (
    "SELECT i.seq, r.receipt_id, r.source, r.evidence, r.recorded_at, r.intent_digest "
    "FROM receipts AS r "
    "JOIN items AS i ON i.idempotency_key = r.idempotency_key "
    f"WHERE i.{_IN.format(seq='i.seq')} ORDER BY i.seq"
)
_DECISIONS = (
    "SELECT seq, operator, at, decision, evidence FROM decisions WHERE run_id = %(run_id)s "
    "ORDER BY id"
)
_EVENT = "SELECT run_id, seq_no, at, kind, item_seq, detail, {links} FROM events "
_EVENTS = _EVENT + "WHERE run_id = %(run_id)s ORDER BY seq_no"
_RUN_EVENTS = (
    _EVENT + "WHERE run_id = %(run_id)s AND (item_seq IS NULL OR kind = 'decision') ORDER BY seq_no"
)
_ITEM_EVENTS = _EVENT + f"WHERE {_IN.format(seq='item_seq')} ORDER BY item_seq, seq_no"
# A database m013 was not applied to (opened read-only: `verify` migrates nothing) has no
# chain: its runs read as planned before it.
_NO_CHAIN = "NULL AS audit_chain, NULL AS audit_key_id"
_NO_LINKS = "NULL AS prev_hash, NULL AS hash"
_NO_NONCE = "NULL AS key_nonce"  # a database from before m002
_NO_CAUSE = "NULL AS stop_cause"  # a database from before m011


class AuditRecords:
    """Reads runs for verify.py, inside one snapshot (`reading`): the rows and the events
    agree."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.engine = core.engine

    @functools.cached_property
    def _items(self) -> str:
        """_ITEMS for this database's schema (read once: `rows` runs once per slice): the
        row identity (m006), a composed row's source digest (m018), the row digest an
        item is compared under (m022: kept where it is not its intent digest), its
        deadline column (m003) and its schedule columns (m009) where they exist."""
        columns = self.engine.columns("items")
        identity = "identity" if "identity" in columns else "NULL"
        source = "NULL"
        if self.engine.has_table("drafts") and "source_digest" in self.engine.columns("drafts"):
            source = _SOURCE
        row_digest = "COALESCE(row_digest, intent_digest)" if "row_digest" in columns else "NULL"
        # The deadline column (m003), and that it is at hand.
        deadline = "not_after, 1" if "not_after" in columns else "NULL AS not_after, 0"
        deadline += " AS deadline_at_hand"  # named: PostgreSQL names unnamed columns alike
        schedule = "not_before, send_window, send_tz, 1"
        if "not_before" not in columns:
            schedule = "NULL AS not_before, NULL AS send_window, NULL AS send_tz, 0"
        schedule += " AS schedule_at_hand"
        return _ITEMS.format(identity=identity, source=source, row_digest=row_digest,
                             deadline=deadline, schedule=schedule)  # fmt: skip

    def _chained(self) -> bool:
        return "audit_chain" in self.engine.columns("runs")

    def _links(self) -> str:
        return "prev_hash, hash" if self._chained() else _NO_LINKS

    def run_ids(self) -> list[str]:
        return [run_id for (run_id,) in self.engine.execute(_RUN_IDS)]

    def reading(self) -> AbstractContextManager[None]:
        return self.core.snapshot()

    def head(self, run_id: str) -> RunHead | None:
        chain = "audit_chain, audit_key_id" if self._chained() else _NO_CHAIN
        columns = self.engine.columns("runs")
        nonce = "key_nonce" if "key_nonce" in columns else _NO_NONCE
        cause = "stop_cause" if "stop_cause" in columns else _NO_CAUSE
        statement = _RUN.format(chain=chain, nonce=nonce, cause=cause)
        row = self.engine.execute(statement, {"run_id": run_id}).fetchone()
        if row is None:
            return None
        (count,) = self.engine.execute(_COUNT, {"run_id": run_id}).fetchone()
        counted = None
        if self.engine.has_table("run_counts"):  # m004's counters, which the reports read
            counted = {
                str(state): int(n)
                for state, n in self.engine.execute(_COUNTERS, {"run_id": run_id})
                if int(n) != 0
            }
        return RunHead(run_id, row.audit_chain, row.audit_key_id, row.state, int(count),
                       row.created_at, self.chained_since(), row.fingerprint, row.approval,
                       row.channel_snapshot, row.options, row.key_nonce, counted,
                       self._applied_at(_ROW_DIGESTS) is not None,
                       {"stop_reason": row.stop_reason, "stop_cause": row.stop_cause})  # fmt: skip

    def chained_since(self) -> str | None:
        """When m013 was applied to this database: every run planned after it is chained."""
        return self._applied_at(_CHAIN)

    def _applied_at(self, name: str) -> str | None:
        """When the migration `name` was applied to this database; None: it was not."""
        for migrator in (migrations.SQLITE, migrations.POSTGRES):
            if self.engine.has_table(migrator.table):
                found = self.engine.execute(_APPLIED_AT.format(table=migrator.table, name=name))
                row = found.fetchone()
                return None if row is None else str(row[0])
        return None

    def item_seqs(self, run_id: str) -> Iterator[int]:
        statement = _SEQS_AND_DRAFTS if self.engine.has_table("drafts") else _SEQS
        for (seq,) in self.engine.stream(statement, {"run_id": run_id}):
            yield int(seq)

    def events(self, run_id: str) -> Iterator[EventRecord]:
        statement = _EVENTS.format(links=self._links())
        for row in self.engine.stream(statement, {"run_id": run_id}):
            yield EventRecord(*row)

    def run_events(self, run_id: str) -> list[EventRecord]:
        statement = _RUN_EVENTS.format(links=self._links())
        return [EventRecord(*r) for r in self.engine.execute(statement, {"run_id": run_id})]

    def item_events(self, run_id: str, seqs: range) -> list[EventRecord]:
        statement = _ITEM_EVENTS.format(links=self._links())
        key = {"run_id": run_id, "lo": seqs.start, "hi": seqs.stop}
        return [EventRecord(*r) for r in self.engine.execute(statement, key)]

    def rows(self, run_id: str, seqs: range) -> RunRows:
        key = {"run_id": run_id, "lo": seqs.start, "hi": seqs.stop}
        items = [tuple(r) for r in self.engine.execute(self._items, key)]
        return RunRows(
            state="",
            items=[ItemRecord(*r[:_ITEM_FIELDS]) for r in items],
            attempts=[AttemptRecord(*r) for r in self.engine.execute(_ATTEMPTS, key)],
            receipts=[ReceiptRecord(*r) for r in self.engine.execute(_RECEIPTS, key)],
            decisions=[],
            intents=[IntentRecord(r[0], *r[_ITEM_FIELDS:]) for r in items],
            drafts=[DraftRecord(*r) for r in self.engine.execute(_DRAFTS, key)]
            if self.engine.has_table("drafts")
            else [],
        )

    def decisions(self, run_id: str) -> list[DecisionRecord]:
        return [DecisionRecord(*r) for r in self.engine.execute(_DECISIONS, {"run_id": run_id})]
