"""The integrity checks every open runs before anything is written (both engines)."""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path
from typing import Any

from .core import _ACTIVE, _ATTENTION, _EVENT_WINDOW
from .engine import Engine
from .exceptions import StoreRefused


def refuse_newer(path: Path | str, applied: Set[str], known: Set[str], untouched: str) -> None:
    """A migration this version does not know means a newer notifier wrote the database:
    refuse it before anything is written (`untouched` names what stays as it was)."""
    newer = sorted(applied - known)
    if newer:
        raise StoreRefused(
            f"{path}: written by a newer version of notifier (schema {newer[-1]} is "
            f"unknown here). Upgrade notifier; {untouched} was not changed."
        )


class Checks:
    """Refusing a database whose rows contradict each other, at a cost bounded by what needs
    attention, never by the size of the runs. Run by every open before anything is written,
    on the engine alone (no store exists yet)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.path = engine.path

    @property
    def conn(self) -> Any:  # read at each use: a test may stand another in its place
        return self.engine.conn

    def check_invariants(self) -> None:
        """Refuse a database whose rows contradict each other: resuming on top of it could
        re-send or skip notifications. The checks read one committed state: a worker
        committing between two of their queries must not look like a contradiction."""
        if not self.engine.has_table("items"):
            return
        with self.engine.snapshot():
            self._check_invariants()

    def _check_invariants(self) -> None:
        problems: list[str] = []
        # Every open pays for these checks, so none walks all the items of a run. With m004,
        # "every sent item has a receipt" is first compared as two counts (each receipt is
        # written with its item's move to sent, and only then), and the items are searched
        # one by one only when the counts disagree.
        if not self.engine.has_table("run_counts") or self._receipts_disagree_with_sent():
            for run_id, seq in self.conn.execute(
                "SELECT i.run_id, i.seq FROM items i WHERE i.state = 'sent' AND NOT EXISTS "
                "(SELECT 1 FROM receipts r WHERE r.idempotency_key = i.idempotency_key) LIMIT 5"
            ):
                problems.append(f"run {run_id} item {seq} is sent but has no receipt")
        for run_id, seq in self.conn.execute(
            f"SELECT i.run_id, i.seq FROM items i {self.engine.indexed('items_attention')} "
            f"WHERE {_ATTENTION} AND i.state = 'in_flight' "
            "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = i.run_id "
            "AND a.seq = i.seq AND a.finished_at IS NULL) LIMIT 5"
        ):
            problems.append(f"run {run_id} item {seq} is in flight but has no open attempt")
        # Driven by the receipts: costs what was sent so far, not the size of the runs.
        for run_id, seq in self.conn.execute(
            f"SELECT i.run_id, i.seq FROM receipts r {self.engine.dialect.ordered_join} items i "
            "ON i.idempotency_key = r.idempotency_key "
            "WHERE i.state = 'sent' AND r.intent_digest != i.intent_digest LIMIT 5"
        ):
            problems.append(f"run {run_id} item {seq} has a receipt for a different digest")
        # Contiguity is checked at the start and the end of each run's events (where a cut
        # or a lost append shows), at most twice _EVENT_WINDOW index entries per run: counting
        # every event of a million-item run on each open would cost more than the rest.
        for (run_id,) in self.conn.execute("SELECT run_id FROM runs"):
            if not self._events_contiguous(run_id):
                problems.append(f"run {run_id} has gaps in its event numbers")
                if len(problems) >= 5:
                    break
        for (run_id,) in self.conn.execute(
            f"SELECT r.run_id FROM runs r WHERE r.state = 'completed' AND EXISTS "
            f"(SELECT 1 FROM items i WHERE i.run_id = r.run_id AND {_ACTIVE}) LIMIT 5"
        ):
            problems.append(f"run {run_id} is completed but still has unfinished items")
        if problems:
            raise StoreRefused(
                f"{self.path}: integrity check failed: {'; '.join(problems)}. The file was not "
                "changed; restore it from a backup or inspect it with sqlite3 before resuming."
            )

    def _events_contiguous(self, run_id: str) -> bool:
        # Two queries: SQLite reads MIN or MAX alone from the index's edge, both at once not.
        (low,) = self.conn.execute(
            "SELECT MIN(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        (high,) = self.conn.execute(
            "SELECT MAX(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        if low is None:
            return True
        if low != 1:
            return False
        window = min(_EVENT_WINDOW, high)
        (head,) = self.conn.execute(
            "SELECT COUNT(*) FROM events WHERE run_id = ? AND seq_no <= ?", (run_id, window)
        ).fetchone()
        (tail,) = self.conn.execute(
            "SELECT COUNT(*) FROM events WHERE run_id = ? AND seq_no > ?",
            (run_id, high - window),
        ).fetchone()
        return bool(head == window and tail == window)

    def _receipts_disagree_with_sent(self) -> bool:
        (receipts,) = self.conn.execute("SELECT COUNT(*) FROM receipts").fetchone()
        (sent,) = self.conn.execute(
            "SELECT COALESCE(SUM(n), 0) FROM run_counts WHERE state = 'sent'"
        ).fetchone()
        return bool(receipts != sent)
