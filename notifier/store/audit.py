"""What verify.py reads of a run (its rows and its chained events), as the plain records of
replay.py: the checks never see the store's internals, so an exported file can be read into
the same records and checked the same way."""

from __future__ import annotations

from ..replay import (
    AttemptRecord,
    DecisionRecord,
    EventRecord,
    ItemRecord,
    ReceiptRecord,
    RunRows,
)
from ..verify import AuditedRun
from .core import Core

_RUN = "SELECT run_id, state, {chain} FROM runs WHERE run_id = %(run_id)s"
_RUN_IDS = "SELECT run_id FROM runs ORDER BY created_at, run_id"
_ITEMS = (
    "SELECT seq, item_id, state, attempts, receipt_id, last_error, next_attempt_at "
    "FROM items WHERE run_id = %(run_id)s ORDER BY seq"
)
_ATTEMPTS = (
    "SELECT seq, n, started_at, finished_at, outcome, http_status, error, retry_after_s, "
    "waited_s FROM attempts WHERE run_id = %(run_id)s ORDER BY seq, n"
)
_RECEIPTS = (
    "SELECT i.seq, r.receipt_id, r.source, r.evidence, r.recorded_at FROM receipts AS r "
    "JOIN items AS i ON i.idempotency_key = r.idempotency_key WHERE i.run_id = %(run_id)s "
    "ORDER BY i.seq"
)
_DECISIONS = (
    "SELECT seq, operator, at, decision, evidence FROM decisions WHERE run_id = %(run_id)s "
    "ORDER BY id"
)
_EVENTS = (
    "SELECT run_id, seq_no, at, kind, item_seq, detail, {links} FROM events "
    "WHERE run_id = %(run_id)s ORDER BY seq_no"
)
# A database m013 was not applied to (opened read-only: `verify` migrates nothing) has no
# chain: its runs read as planned before it.
_NO_CHAIN = "NULL AS audit_chain, NULL AS audit_key_id"
_NO_LINKS = "NULL AS prev_hash, NULL AS hash"


class AuditRecords:
    """Reads a run for verify.py, in one snapshot (the rows and the events agree)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.engine = core.engine

    def run_ids(self) -> list[str]:
        return [run_id for (run_id,) in self.engine.execute(_RUN_IDS)]

    def run(self, run_id: str) -> AuditedRun | None:
        chained = "audit_chain" in self.engine.columns("runs")
        read_run = _RUN.format(chain="audit_chain, audit_key_id" if chained else _NO_CHAIN)
        read_events = _EVENTS.format(links="prev_hash, hash" if chained else _NO_LINKS)
        with self.core.snapshot():
            row = self.engine.execute(read_run, {"run_id": run_id}).fetchone()
            if row is None:
                return None
            key = {"run_id": run_id}
            rows = RunRows(
                state=row.state,
                items=[ItemRecord(*r) for r in self.engine.execute(_ITEMS, key)],
                attempts=[AttemptRecord(*r) for r in self.engine.execute(_ATTEMPTS, key)],
                receipts=[ReceiptRecord(*r) for r in self.engine.execute(_RECEIPTS, key)],
                decisions=[DecisionRecord(*r) for r in self.engine.execute(_DECISIONS, key)],
            )
            events = [EventRecord(*r) for r in self.engine.execute(read_events, key)]
        return AuditedRun(run_id, row.audit_chain, row.audit_key_id, rows, events)
