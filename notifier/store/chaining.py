"""A write transaction's events, chained at COMMIT (chain.py), the same way on both engines.

Each engine keeps the events a transaction writes (DueEvents) and, as its last step before
COMMIT, reads each run's head (its chain kind, key id, and last event) and numbers and
links the new events after it. On SQLite the file's write lock is held from BEGIN; on
PostgreSQL the run's row, taken at COMMIT (postgres.py): either way no other writer of the
run can slip an event between the head read and the insert, and no lock wider than the
run's is taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from notifier.domain.chain import ChainKind, Signer
from notifier.store.exceptions import AuditKeyMismatch

# A run's head: how it is chained, its key's id, and its last event's number and hash.
HEAD = (
    "SELECT r.audit_chain, r.audit_key_id, e.seq_no, e.hash FROM runs AS r "
    "LEFT JOIN events AS e ON e.run_id = r.run_id AND e.seq_no = "
    "(SELECT MAX(m.seq_no) FROM events AS m WHERE m.run_id = r.run_id) "
    "WHERE r.run_id = %(run_id)s"
)
COLUMNS = "run_id, seq_no, at, kind, item_seq, detail, prev_hash, hash"

# An event as written: (run_id, kind, item_seq, detail, at).
Due = tuple[str, str, int | None, str | None, str]
# Several items' events' detail (JSON text): one shared, or each seq's own.
Detail = str | None | Mapping[int, str | None]


class Head(NamedTuple):
    chain: str | None
    key_id: str | None
    seq_no: int
    hash: str | None


def head_of(row: Any) -> Head:
    """A HEAD row as a Head (a run without events yet: number 0, no hash; a run not found
    is left to the insert's foreign key to refuse)."""
    if row is None:
        return Head(None, None, 0, None)
    return Head(row[0], row[1], int(row[2] or 0), row[3])


class DueEvents:
    """The events of the open transaction, in the order written."""

    def __init__(self) -> None:
        self.rows: list[Due] = []

    def add(self, run_id: str, kind: str, item_seq: int | None, detail: str | None,
            at: str) -> None:  # fmt: skip
        self.rows.append((run_id, kind, item_seq, detail, at))

    def extend(
        self,
        run_id: str,
        kind: str,
        seqs: Sequence[int],
        detail: Detail,
        at: str,
    ) -> None:
        """Several items' events: one shared detail, or each seq's own (a mapping)."""
        if isinstance(detail, Mapping):
            self.rows.extend((run_id, kind, seq, detail[seq], at) for seq in seqs)
        else:
            self.rows.extend((run_id, kind, seq, detail, at) for seq in seqs)

    def take(self) -> list[Due]:
        rows, self.rows = self.rows, []
        return rows

    def runs(self) -> list[str]:
        return sorted({row[0] for row in self.rows})


def linked(due: Sequence[Due], heads: Mapping[str, Head], signer: Signer) -> list[tuple[Any, ...]]:
    """The rows to insert (COLUMNS), numbered and linked after each run's head. A run
    planned before the chain stays unchained; a keyed run is written only with its key."""
    state: dict[str, tuple[int, str | None, Signer | None]] = {}
    for run_id, head in heads.items():
        state[run_id] = (head.seq_no, head.hash, _signer_for(run_id, head, signer))
    rows: list[tuple[Any, ...]] = []
    for run_id, kind, item_seq, detail, at in due:
        seq_no, prev, link = state[run_id]
        seq_no += 1
        if link is None:
            rows.append((run_id, seq_no, at, kind, item_seq, detail, None, None))
            state[run_id] = (seq_no, None, None)
            continue
        hashed = link.link(prev, run_id, seq_no, kind, item_seq, detail, at)
        rows.append((run_id, seq_no, at, kind, item_seq, detail, prev, hashed))
        state[run_id] = (seq_no, hashed, link)
    return rows


def _signer_for(run_id: str, head: Head, signer: Signer) -> Signer | None:
    if head.chain is None:
        return None
    kind = ChainKind(head.chain)
    if kind is ChainKind.KEYED and signer.key_id != head.key_id:
        held = f"the key with id {signer.key_id}" if signer.key_id else "no audit key"
        raise AuditKeyMismatch(
            f"run {run_id}: its events are keyed with the audit key whose id is "
            f"{head.key_id}, and this process has {held}; writing on would break the run's "
            "chain, so nothing was written. Set NOTIFIER_AUDIT_KEY (or [audit] key_file in "
            "notifier.toml) to that key and run the command again."
        )
    return signer.for_kind(kind)


def run_columns(signer: Signer) -> dict[str, str | None]:
    """What a new run records of how its events are chained."""
    return {"audit_chain": signer.kind.value, "audit_key_id": signer.key_id}
