"""The ledger: every write of a run's history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import clock
from ..records import (
    Item,
    Outcome,
    item_from_row,
)
from ..state_machine import (
    FINISHED_RUN_STATES,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
    item_next,
)
from . import waiting, writes
from .core import (
    _ACTIVE,
    MAYBE_DELIVERED,
    Core,
    _dump,
    _plain_ack,
    _state_literal,
    retried,
)
from .exceptions import LostRace
from .suppressions import Suppressions
from .writes import Group, Write


class Ledger:
    """Point A and point B, decisions, cancels and approvals: every write of a run's history
    once it is planned (planning.py stores the plan itself)."""

    def __init__(self, core: Core, suppressions: Suppressions) -> None:
        self.core = core
        self.suppressions = suppressions

    def move_run(
        self, run_id: str, trigger: RunTrigger, lease_version: int | None = None, **sets: Any
    ) -> RunState:
        with self.core.write(run_id, lease_version):
            return self.core.move_run(run_id, trigger, clock.now_iso(), **sets)

    @retried
    def move_run_from(
        self,
        run_id: str,
        trigger: RunTrigger,
        lease_version: int,
        allowed: Sequence[RunState],
        **sets: Any,
    ) -> RunState:
        """`move_run` for a run other workers share: the move happens only if the run is in
        one of `allowed` when the transaction reads it; otherwise another worker moved it
        first, and its state is returned unchanged."""
        with self.core.write(run_id, lease_version):
            current = self.core.locked_run(run_id).state
            if current not in allowed:
                return current
            return self.core.move_run(run_id, trigger, clock.now_iso(), **sets)

    @retried
    def replace_stop_reason(
        self, run_id: str, lease_version: int, expected: str, reason: str | None
    ) -> bool:
        """Replace the run's stop reason `expected` by `reason` (None clears it), fenced, and
        only while it is still `expected`: a reason another process wrote meanwhile stays.
        Not a move: the run's state is unchanged. True if it was replaced."""
        with self.core.write(run_id, lease_version):
            cursor = self.core.conn.execute(
                "UPDATE runs SET stop_reason = ?, updated_at = ? "
                "WHERE run_id = ? AND stop_reason = ?",
                (reason, clock.now_iso(), run_id, expected),
            )
            return bool(cursor.rowcount == 1)

    @retried
    def expire_due(self, run_id: str, lease_version: int) -> list[int]:
        """Pending items whose deadline has passed become `expired` (never sent), in one
        fenced transaction. An item whose last attempt may have been delivered is left for
        the runner to settle: expiring it would claim "never sent" without knowing."""
        at = clock.now_iso()
        due = self._due_for_expiry(run_id, at)
        if not due:
            return []  # the common case costs one indexed read, no write transaction
        expired: list[int] = []
        with self.core.write(run_id, lease_version):
            # Locked as claims lock theirs: an item another worker is claiming right now is
            # left to its claim, not moved under it (a lost race would stop this worker).
            for seq in self._due_for_expiry(run_id, at, self.core.dialect.claim_lock):
                self.core.move_item(run_id, seq, ItemState.PENDING, ItemTrigger.EXPIRE, at)
                expired.append(seq)
        return expired

    def _due_for_expiry(self, run_id: str, at: str, lock: str = "") -> list[int]:
        return [
            seq
            for (seq,) in self.core.conn.execute(
                "SELECT i.seq FROM items i WHERE i.run_id = ? AND i.state = 'pending' "
                "AND i.not_after IS NOT NULL AND i.not_after <= ? AND (i.attempts = 0 OR "
                f"NOT {MAYBE_DELIVERED}) ORDER BY i.seq {lock}",
                (run_id, at),
            )
        ]

    def past_deadline(self, run_id: str, at: str) -> int:
        """How many unfinished items are already past their deadline at `at`."""
        (n,) = self.core.conn.execute(
            "SELECT COUNT(*) FROM items WHERE run_id = ? AND state = 'pending' "
            "AND not_after IS NOT NULL AND not_after <= ?",
            (run_id, at),
        ).fetchone()
        return int(n)

    def claim(
        self,
        run_id: str,
        lease_version: int,
        limit: int,
        *,
        exclude_channels: Sequence[str] = (),
        exclude_seqs: Sequence[int] = (),
    ) -> list[Item]:
        """Point A for a window: up to `limit` due pending items become in_flight, each with
        an open attempt row, in one transaction. `exclude_seqs`: items the caller still holds
        back (a backoff it times on the monotonic clock)."""
        return self.step(
            run_id,
            lease_version,
            (),
            limit,
            exclude_channels=exclude_channels,
            exclude_seqs=exclude_seqs,
        )

    @retried
    def record(self, run_id: str, lease_version: int | None, outcomes: Sequence[Outcome]) -> None:
        """Point B for a window: every outcome (receipt, attempt closed, state moved) in one
        transaction."""
        if not outcomes:
            return
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            for outcome in outcomes:
                self._record_one(run_id, outcome, at)
            self.suppressions.suppress_rejected(run_id, outcomes, at)

    @retried
    def step(
        self,
        run_id: str,
        lease_version: int,
        outcomes: Sequence[Outcome],
        claim_limit: int,
        *,
        exclude_channels: Sequence[str] = (),
        exclude_seqs: Sequence[int] = (),
    ) -> list[Item]:
        """One group commit of the pipeline: point B of every finished send in `outcomes`
        and point A of up to `claim_limit` newly claimed items, in one transaction (one
        fsync for all of them). Outcomes are recorded first, so a slot they free can be
        claimed again in the same commit. Returns the claimed items."""
        if not outcomes and claim_limit <= 0:
            return []
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            acks = [o for o in outcomes if _plain_ack(o)]
            for outcome in outcomes:
                if not _plain_ack(outcome):
                    self._record_one(run_id, outcome, at)
            self._record_acks(run_id, acks, at)
            self.suppressions.suppress_rejected(run_id, outcomes, at)
            if claim_limit <= 0:
                return []
            return self._claim(run_id, at, claim_limit, exclude_channels, exclude_seqs)

    def _record_acks(self, run_id: str, acks: Sequence[Outcome], at: str) -> None:
        """`_record_one` for many answered sends at once, in four statements instead of four
        per item: with senders on other threads, every statement is one more wait for the
        GIL, and the committer's turn is what a freed slot waits for. Same rows, same
        conditional move (in_flight → sent, all or none)."""
        if not acks:
            return
        # The first row's CASTs type the VALUES columns: PostgreSQL cannot infer the type of
        # a column that is all NULL parameters (http_status and retry_after_s often are).
        values = ", ".join(
            ["(?, ?, ?, CAST(? AS INTEGER), ?, CAST(? AS DOUBLE PRECISION), ?, ?, ?, ?)"]
            + ["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (len(acks) - 1)
        )
        params: list[Any] = []
        for o in acks:
            params += [o.seq, o.finished_at or at, o.attempt_outcome, o.http_status, o.error,
                       o.retry_after_s, o.receipt_id, o.receipt_source, o.evidence,
                       o.started_at]  # fmt: skip
        current = ItemState.IN_FLIGHT
        target = item_next(ItemTrigger.ACK, current)
        detail = {"from": current.value, "to": target.value}
        # Each statement reads the answers from `{v}`: a VALUES list, or the WITH naming it.
        close_attempts = Write(
            "UPDATE attempts SET finished_at = v.column2, outcome = v.column3, "
            "http_status = v.column4, error = v.column5, retry_after_s = v.column6, "
            "started_at = COALESCE(v.column10, attempts.started_at) "
            "FROM {v} WHERE attempts.run_id = ? AND attempts.seq = v.column1 "
            "AND attempts.finished_at IS NULL",
            after=[run_id],
        )
        add_receipts = Write(
            "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, evidence, "
            "recorded_at) SELECT i.idempotency_key, i.intent_digest, v.column7, v.column8, "
            "v.column9, ? FROM {v} JOIN items AS i ON i.run_id = ? AND i.seq = v.column1",
            before=[at],
            after=[run_id],
        )
        move_items = Write(
            "UPDATE items SET state = ?, updated_at = ?, next_attempt_at = NULL, "
            "last_error = v.column5, receipt_id = v.column7 FROM {v} "
            "WHERE items.run_id = ? AND items.seq = v.column1 "
            f"AND items.state = {_state_literal(current)}",
            before=[target.value, at],
            after=[run_id],
        )
        # As one statement, every part sees the same snapshot, and the events are those of
        # the rows really moved (PostgreSQL numbers them at COMMIT: see postgres.py).
        group = Group([close_attempts, add_receipts, move_items], 2, "items.seq", values, params)
        moved = writes.run(self.core.conn, self.core.dialect, group)
        seqs = moved.seqs if moved.seqs is not None else [o.seq for o in acks]
        self.core.events(run_id, "ack", seqs, detail, at)
        if moved.rowcount != len(acks):  # raised inside the transaction: every write is undone
            raise LostRace(f"run {run_id}: expected {len(acks)} items in_flight for ack")

    def _claim(
        self,
        run_id: str,
        at: str,
        limit: int,
        exclude_channels: Sequence[str],
        exclude_seqs: Sequence[int],
    ) -> list[Item]:
        where = f"run_id = ? AND {_ACTIVE} AND state = 'pending' "
        where += f"AND (next_attempt_at IS NULL OR next_attempt_at <= ?) AND {waiting.DUE}"
        params: list[Any] = [run_id, at, at]
        if exclude_channels:
            where += " AND channel NOT IN ({})".format(", ".join("?" * len(exclude_channels)))
            params.extend(exclude_channels)
        if exclude_seqs:
            where += " AND seq NOT IN ({})".format(", ".join("?" * len(exclude_seqs)))
            params.extend(exclude_seqs)
        rows = self._claimable(run_id, where, params, limit, at)
        if not rows:
            return []
        waited: list[float | None] = []
        for row in rows:
            last = None
            if row.attempts:
                last = self.core.conn.execute(
                    "SELECT finished_at FROM attempts WHERE run_id = ? AND seq = ? "
                    "ORDER BY n DESC LIMIT 1",
                    (run_id, row.seq),
                ).fetchone()
            seconds = None
            if last and last[0]:
                seconds = (clock.parse(at) - clock.parse(last[0])).total_seconds()
            waited.append(seconds)
        # The claim as set-based statements (see _record_acks): every row was read pending
        # in this transaction, and the move is still conditional on it.
        current = ItemState.PENDING
        target = item_next(ItemTrigger.START, current)
        detail = {"from": current.value, "to": target.value}
        seqs = [row.seq for row in rows]
        marks = ", ".join("?" * len(seqs))
        move_items = Write(
            "UPDATE items SET state = ?, updated_at = ?, attempts = attempts + 1, "
            "next_attempt_at = NULL, worker_id = ? "
            f"WHERE run_id = ? AND seq IN ({marks}) AND state = {_state_literal(current)}",
            before=[target.value, at, self.core.worker_id, run_id, *seqs],
        )
        # n counts attempt rows, not the item's attempts: a released attempt (claimed,
        # never started) keeps its row but is not counted as an attempt.
        values = ", ".join(["(?, CAST(? AS DOUBLE PRECISION))"] + ["(?, ?)"] * (len(seqs) - 1))
        open_attempts = Write(
            "INSERT INTO attempts (run_id, seq, n, started_at, waited_s) "
            "SELECT ?, v.column1, (SELECT COALESCE(MAX(n), 0) + 1 FROM attempts AS a "
            "WHERE a.run_id = ? AND a.seq = v.column1), ?, v.column2 "
            f"FROM (VALUES {values}) AS v",
            before=[run_id, run_id, at, *[x for pair in zip(seqs, waited, strict=True)
                                          for x in pair]],
        )  # fmt: skip
        moved = writes.run(self.core.conn, self.core.dialect, Group([move_items, open_attempts], 0))
        self.core.events(run_id, "start", seqs if moved.seqs is None else moved.seqs, detail, at)
        if moved.rowcount != len(seqs):  # raised inside the transaction: every write is undone
            raise LostRace(f"run {run_id}: expected {len(seqs)} items pending for start")
        # The items as the move left them.
        return [
            item_from_row(row, state=target, attempts=row.attempts + 1, next_attempt_at=None)
            for row in rows
        ]

    def _claimable(
        self, run_id: str, where: str, params: Sequence[Any], limit: int, at: str
    ) -> list[Any]:
        """Up to `limit` pending rows matching `where` that may be claimed now, locked as
        claims lock theirs. Read again while the suppression check moves some out of
        pending, or a closed window gives some a later not_before: rows left out so must not
        stand in for the due rows after them (a claim of none reads as "nothing may start
        now")."""
        reopened: set[int] = set()
        while True:
            found = self.core.conn.execute(
                f"SELECT *, {self.suppressions.on_list()} FROM items WHERE {where} "
                "ORDER BY seq LIMIT ? "
                f"{self.core.dialect.claim_lock}",
                [*params, limit],
            ).fetchall()
            gone = self.suppressions.suppressed_claims(run_id, found, at) if found else set()
            rows = [row for row in found if row.seq not in gone]
            if gone:
                continue
            kept = waiting.keep_open(self.core.conn, run_id, rows, at)
            dropped = {row.seq for row in rows} - {row.seq for row in kept}
            if not dropped or dropped <= reopened:  # the latter: no progress, never a spin
                return kept
            reopened |= dropped

    def _record_one(self, run_id: str, o: Outcome, at: str) -> None:
        if o.attempt_outcome is not None:
            self.core.conn.execute(
                "UPDATE attempts SET finished_at = ?, outcome = ?, http_status = ?, error = ?, "
                "retry_after_s = ?, started_at = COALESCE(?, started_at) "
                "WHERE run_id = ? AND seq = ? AND finished_at IS NULL",
                (
                    o.finished_at or at,
                    o.attempt_outcome,
                    o.http_status,
                    o.error,
                    o.retry_after_s,
                    o.started_at,
                    run_id,
                    o.seq,
                ),
            )
        sets: dict[str, Any] = {"next_attempt_at": o.next_attempt_at}
        if o.error is not None or o.trigger in (
            ItemTrigger.ACK,
            ItemTrigger.FOUND,
            ItemTrigger.MARK_SENT,
        ):
            sets["last_error"] = o.error
        if o.gate_until is not None:
            # The latest time any worker's downstream asked the channel to stay away.
            self.core.conn.execute(
                "INSERT INTO channel_gates (run_id, channel, closed_until) "
                "SELECT run_id, channel, ? FROM items WHERE run_id = ? AND seq = ? "
                "ON CONFLICT (run_id, channel) DO UPDATE SET closed_until = excluded.closed_until "
                "WHERE channel_gates.closed_until < excluded.closed_until",
                (o.gate_until, run_id, o.seq),
            )
        if o.receipt_source is not None:
            sets["receipt_id"] = o.receipt_id
            # The receipt carries the digest stored with the intent, copied in SQL.
            self.core.conn.execute(
                "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, "
                "evidence, recorded_at) SELECT idempotency_key, intent_digest, ?, ?, ?, ? "
                "FROM items WHERE run_id = ? AND seq = ?",
                (o.receipt_id, o.receipt_source, o.evidence, at, run_id, o.seq),
            )
        if o.trigger == ItemTrigger.RELEASE:
            # Claimed but never started: it does not count as an attempt (the move below is
            # conditional on in_flight, so a lost race rolls this back too).
            self.core.conn.execute(
                "UPDATE items SET attempts = attempts - 1 WHERE run_id = ? AND seq = ? "
                "AND state = 'in_flight' AND attempts > 0",
                (run_id, o.seq),
            )
        current = o.expected
        if current is None:
            (state,) = self.core.conn.execute(
                "SELECT state FROM items WHERE run_id = ? AND seq = ?", (run_id, o.seq)
            ).fetchone()
            current = ItemState(state)
        self.core.move_item(run_id, o.seq, current, o.trigger, at, **sets)

    def decide(
        self,
        run_id: str,
        seq: int,
        trigger: ItemTrigger,
        operator: str,
        evidence: str,
        lease_version: int,
    ) -> None:
        """A manual reconcile decision: the move, its audit row and, for `mark_sent`, a
        receipt whose source is `manual` — all in one transaction."""
        at = clock.now_iso()
        with self.core.write(run_id, lease_version):
            self.core.conn.execute(
                "INSERT INTO decisions (run_id, seq, operator, at, decision, evidence) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, seq, operator, at, trigger, evidence),
            )
            self.core.event(
                run_id,
                "decision",
                seq,
                {"decision": trigger, "operator": operator, "evidence": evidence},
                at,
            )
            source = "manual" if trigger == ItemTrigger.MARK_SENT else None
            self._record_one(
                run_id, Outcome(seq, trigger, receipt_source=source, evidence=evidence), at
            )

    def record_approval(self, run_id: str, approval: dict[str, Any], state_version: int) -> None:
        """Bind an approval, only if the run has not changed since it was reviewed at
        `state_version` (its last event number): otherwise LostRace, nothing written. A run
        awaiting approval moves to `approved`; a run already past that gets a fresh record."""
        at = clock.now_iso()
        with self.core.write():
            # The run's row first: every write that appends to its history numbers its
            # events under that row (postgres.py), so the version read next cannot change.
            run = self.core.locked_run(run_id)
            if self.state_version(run_id) != state_version:
                raise LostRace(f"run {run_id} changed while it was being approved")
            if run.state is RunState.AWAITING_APPROVAL:
                self.core.move_run(run_id, RunTrigger.APPROVE, at, approval=_dump(approval))
                return
            cursor = self.core.conn.execute(
                "UPDATE runs SET approval = ?, updated_at = ? WHERE run_id = ? AND state = ?",
                (_dump(approval), at, run_id, run.state.value),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} changed while it was being approved")
            self.core.event(run_id, "approval_renewed", None, approval, at)

    def reject_run(self, run_id: str, operator: str, reason: str) -> None:
        """Close a run awaiting approval (`reject`: to cancelled) with its audit: who, when
        and why, in the run's stop reason and in a `rejected` event, in one transaction.
        A conditional move: a run that left awaiting_approval meanwhile (approved by someone
        else) raises IllegalMove, nothing written."""
        at = clock.now_iso()
        with self.core.write():
            self.core.move_run(
                run_id, RunTrigger.REJECT, at, stop_reason=f"rejected by {operator}: {reason}"
            )
            self.core.event(
                run_id, "rejected", None, {"operator": operator, "at": at, "reason": reason}, at
            )

    def state_version(self, run_id: str) -> int:
        """The run's state version: the number of its last event. Every state move and
        every item outcome appends one, so an approval bound to it names one exact state."""
        row = self.core.conn.execute(
            "SELECT MAX(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        return int(row[0] or 0)

    def request_cancel(self, run_id: str) -> bool:
        """Flag the run for cancel; False (nothing written) when it already finished, e.g. a
        worker completed it between the caller's read and this write."""
        at = clock.now_iso()
        finished = ", ".join(f"'{s.value}'" for s in FINISHED_RUN_STATES)
        with self.core.write():
            cursor = self.core.conn.execute(
                "UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, ?), "
                f"updated_at = ? WHERE run_id = ? AND state NOT IN ({finished})",
                (at, at, run_id),
            )
            if cursor.rowcount != 1:
                return False
            self.core.event(run_id, "cancel_requested", None, None, at)
        return True
