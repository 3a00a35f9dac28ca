"""The integrity checks every open runs before anything is written (both engines)."""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

from notifier.store import statements
from notifier.store.backend import Engine, snapshot
from notifier.store.exceptions import StoreRefused
from notifier.store.statements import checks as sql


def refuse_newer(path: Path | str, applied: Set[str], known: Set[str], untouched: str) -> None:
    """A migration this version does not know means a newer notifier wrote the database:
    refuse it before anything is written (`untouched` names what stays as it was)."""
    newer = sorted(applied - known)
    if newer:
        raise StoreRefused(
            f"{path}: written by a newer version of notifier (schema {newer[-1]} is "
            f"unknown here). Upgrade notifier; {untouched} was not changed."
        )


# Events checked for gaps at each end of a run's history when a database is opened.
EVENT_WINDOW = 10_000


class Checks:
    """Refusing a database whose rows contradict each other, at a cost bounded by what needs
    attention, never by the size of the runs. Run by every open before anything is written,
    on the engine alone (no store exists yet)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.path = engine.path

    def check_invariants(self) -> None:
        """Refuse a database whose rows contradict each other: resuming on top of it could
        re-send or skip notifications. The checks read one committed state: a worker
        committing between two of their queries must not look like a contradiction."""
        if not self.engine.has_table("items"):
            return
        with snapshot(self.engine):
            self._check_invariants()

    def _check_invariants(self) -> None:
        problems: list[str] = []
        # Every open pays for these checks, so none walks all the items of a run. With m004,
        # "every sent item has a receipt" is first compared as two counts (each receipt is
        # written with its item's move to sent, and only then), and the items are searched
        # one by one only when the counts disagree.
        if not self.engine.has_table("run_counts") or self._receipts_disagree_with_sent():
            for run_id, seq in self.engine.execute(sql.SENT_WITHOUT_RECEIPT):
                problems.append(f"run {run_id} item {seq} is sent but has no receipt")
        for run_id, seq in self.engine.execute(sql.IN_FLIGHT_WITHOUT_ATTEMPT):
            problems.append(f"run {run_id} item {seq} is in flight but has no open attempt")
        # Driven by the receipts: costs what was sent so far, not the size of the runs.
        for run_id, seq in self.engine.execute(sql.RECEIPT_OF_ANOTHER_DIGEST):
            problems.append(f"run {run_id} item {seq} has a receipt for a different digest")
        # Contiguity is checked at the start and the end of each run's events (where a cut
        # or a lost append shows), at most twice EVENT_WINDOW index entries per run: counting
        # every event of a million-item run on each open would cost more than the rest.
        for (run_id,) in self.engine.execute(sql.RUN_IDS):
            if not self._events_contiguous(run_id):
                problems.append(f"run {run_id} has gaps in its event numbers")
                if len(problems) >= 5:
                    break
        for (run_id,) in self.engine.execute(sql.COMPLETED_WITH_ACTIVE_ITEMS):
            problems.append(f"run {run_id} is completed but still has unfinished items")
        if problems:
            raise StoreRefused(
                f"{self.path}: integrity check failed: {'; '.join(problems)}. The file was not "
                "changed; restore it from a backup or inspect it with sqlite3 before resuming."
            )

    def _events_contiguous(self, run_id: str) -> bool:
        (low,) = self.engine.execute(sql.FIRST_EVENT, {"run_id": run_id}).fetchone()
        (high,) = self.engine.execute(statements.LAST_EVENT, {"run_id": run_id}).fetchone()
        if low is None:
            return True
        if low != 1:
            return False
        window = min(EVENT_WINDOW, high)
        (head,) = self.engine.execute(
            sql.EVENTS_UP_TO, {"run_id": run_id, "seq_no": window}
        ).fetchone()
        (tail,) = self.engine.execute(
            sql.EVENTS_AFTER, {"run_id": run_id, "seq_no": high - window}
        ).fetchone()
        return bool(head == window and tail == window)

    def _receipts_disagree_with_sent(self) -> bool:
        (receipts,) = self.engine.execute(sql.RECEIPT_COUNT).fetchone()
        (sent,) = self.engine.execute(sql.SENT_COUNT).fetchone()
        return bool(receipts != sent)
