"""Message Batches chunks of a --compose run (m007): each chunk an intent recorded before
its batch is created, its batch id after, and its end once every result is stored."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from notifier.domain import clock
from notifier.store.core import Core
from notifier.store.exceptions import LostRace
from notifier.store.statements import chunks as sql

OPEN = ("creating", "submitted")


@dataclass(frozen=True)
class Chunk:
    run_id: str
    chunk: int
    state: str  # creating | submitted | done | canceled
    seqs: tuple[int, ...]
    request_count: int
    requests_digest: str
    model: str
    not_before: str
    batch_id: str | None
    recreate: bool
    created: int  # batches created for it (more than 1 only with --recreate)
    note: str | None


class Chunks:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.engine = core.engine

    def chunks(self, run_id: str, states: Sequence[str] | None = None) -> list[Chunk]:
        rows = self.engine.execute(sql.CHUNKS, {"run_id": run_id}).fetchall()
        found = [
            Chunk(r[0], int(r[1]), r[2], tuple(json.loads(r[3])), int(r[4]), r[5], r[6], r[7],
                  r[8], bool(r[9]), int(r[10]), r[11])
            for r in rows
        ]  # fmt: skip
        return [c for c in found if states is None or c.state in states]

    def record_chunk(
        self,
        run_id: str,
        chunk: int,
        seqs: Sequence[int],
        requests_digest: str,
        model: str,
        not_before: str,
        lease_version: int | None = None,
    ) -> None:
        """The intent of chunk number `chunk` (one past the last: its custom_ids, in the
        digest, carry it), before its batch is created."""
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            self.engine.execute(
                sql.RECORD_CHUNK,
                {
                    "run_id": run_id,
                    "chunk": chunk,
                    "seqs": json.dumps(list(seqs)),
                    "request_count": len(seqs),
                    "requests_digest": requests_digest,
                    "model": model,
                    "not_before": not_before,
                    "at": at,
                },
            )
            self.core.event(run_id, "chunk_creating", None, {"chunk": chunk, "rows": len(seqs)}, at)

    def chunk_create_started(
        self, run_id: str, chunk: int, lease_version: int | None = None
    ) -> None:
        """A create of the chunk's batch starts: a `--recreate` consent is spent by it, in
        the same transaction, so a crash after the create leaves the next resume asking."""
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            cursor = self.engine.execute(
                sql.CHUNK_CREATE_STARTED, {"at": at, "run_id": run_id, "chunk": chunk}
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} chunk {chunk}: not creating")
            self.core.event(run_id, "chunk_create_started", None, {"chunk": chunk}, at)

    def chunk_submitted(
        self,
        run_id: str,
        chunk: int,
        batch_id: str,
        *,
        created: bool,
        note: str | None = None,
        lease_version: int | None = None,
    ) -> None:
        """The chunk's batch: created by us just now (`created`) or adopted after asking."""
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            cursor = self.engine.execute(
                sql.CHUNK_SUBMITTED,
                {
                    "batch_id": batch_id,
                    "created": 1 if created else 0,
                    "note": note,
                    "at": at,
                    "run_id": run_id,
                    "chunk": chunk,
                },
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} chunk {chunk}: not creating")
            kind = "chunk_submitted" if created else "chunk_adopted"
            self.core.event(run_id, kind, None, {"chunk": chunk, "batch_id": batch_id}, at)

    def end_chunk(
        self,
        run_id: str,
        chunk: int,
        state: str,
        note: str | None = None,
        lease_version: int | None = None,
    ) -> None:
        """`done` (every result stored) or `canceled` (by `notifier cancel`). The chunk
        writes of a drafting process carry its `lease_version` (fenced); `cancel`'s do not."""
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            self.engine.execute(
                sql.END_CHUNK,
                {"state": state, "note": note, "at": at, "run_id": run_id, "chunk": chunk},
            )
            self.core.event(run_id, f"chunk_{state}", None, {"chunk": chunk, "note": note}, at)

    def choose_recreate(self, run_id: str) -> int:
        """`resume --recreate`: the chunks still `creating` are created again without asking
        (the operator accepts paying twice for one created before). Returns how many."""
        at = clock.now_iso()
        with self.core.write():
            cursor = self.engine.execute(sql.CHOOSE_RECREATE, {"at": at, "run_id": run_id})
            n = int(cursor.rowcount)
            self.core.event(run_id, "recreate_chosen", None, {"chunks": n}, at)
        return n

    def chunk_summary(self, run_id: str) -> dict[str, int]:
        """Chunks per state and the batches created for them (status's drafting line)."""
        summary = {"chunks": 0, "creating": 0, "submitted": 0, "done": 0, "canceled": 0}
        summary["batches_created"] = 0
        if not self.engine.has_table("draft_chunks"):  # read-only, before m007
            return summary
        for state, n, created in self.engine.execute(sql.CHUNK_SUMMARY, {"run_id": run_id}):
            summary[state] = int(n)
            summary["chunks"] += int(n)
            summary["batches_created"] += int(created)
        return summary
