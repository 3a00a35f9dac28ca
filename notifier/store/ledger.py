"""The ledger: every write of a run's history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from notifier.domain import clock
from notifier.domain.records import AttemptOutcome, Item, Outcome, StopCause, item_from_row
from notifier.domain.state_machine import ItemState, ItemTrigger, RunState, RunTrigger, item_next
from notifier.store import statements, waiting, writes
from notifier.store.core import Core, as_json, plain_ack, retried
from notifier.store.exceptions import AuditKeyMismatch, LostRace
from notifier.store.statements import ledger as sql
from notifier.store.suppressions import Suppressions
from notifier.store.writes import Group


class Ledger:
    """Point A and point B, decisions, cancels and approvals: every write of a run's history
    once it is planned (plans.py stores the plan itself)."""

    def __init__(self, core: Core, suppressions: Suppressions) -> None:
        self.core = core
        self.engine = core.engine
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
        """Replace the reason `expected` of a run paused for unknown outcomes
        (StopCause.UNKNOWN_LEFT) by `reason`; None clears the reason and its cause. Fenced,
        and only while both are still as read: a stop another process wrote meanwhile stays.
        Not a move: the run's state is unchanged. True if it was replaced."""
        cause = StopCause.UNKNOWN_LEFT
        with self.core.write(run_id, lease_version):
            cursor = self.engine.execute(
                sql.REPLACE_STOP_REASON,
                {"reason": reason, "cause": None if reason is None else cause.value,
                 "at": clock.now_iso(), "run_id": run_id, "expected": expected,
                 "expected_cause": cause.value},
            )  # fmt: skip
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
            for seq in self._due_for_expiry(run_id, at, sql.DUE_FOR_EXPIRY_LOCKED):
                self.core.move_item(run_id, seq, ItemState.PENDING, ItemTrigger.EXPIRE, at)
                expired.append(seq)
        return expired

    def _due_for_expiry(self, run_id: str, at: str, read: str = sql.DUE_FOR_EXPIRY) -> list[int]:
        return [seq for (seq,) in self.engine.execute(read, {"run_id": run_id, "at": at})]

    def past_deadline(self, run_id: str, at: str) -> int:
        """How many unfinished items are already past their deadline at `at`."""
        (n,) = self.engine.execute(sql.PAST_DEADLINE, {"run_id": run_id, "at": at}).fetchone()
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
            acks = [o for o in outcomes if plain_ack(o)]
            for outcome in outcomes:
                if not plain_ack(outcome):
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
        current = ItemState.IN_FLIGHT
        target = item_next(ItemTrigger.ACK, current)
        moves = {"from": current.value, "to": target.value}
        params: dict[str, Any] = {"run_id": run_id, "at": at, "target": target.value}
        details: dict[int, Any] = {}
        for names, o in zip(sql.ack_names(len(acks)), acks, strict=True):
            row = (o.seq, o.finished_at or at, _stored(o.attempt_outcome), o.http_status, o.error,
                   o.retry_after_s, o.receipt_id, o.receipt_source, o.evidence,
                   o.started_at)  # fmt: skip
            params.update(zip(names, row, strict=True))
            # What the statements below write of this item, in its event (replay.py).
            details[o.seq] = {
                **moves,
                "set": {"next_attempt_at": None, "last_error": o.error,
                        "receipt_id": o.receipt_id},
                **_written(o, at),
            }  # fmt: skip
        # As one statement, every part sees the same snapshot, and the events are those of
        # the rows really moved (PostgreSQL numbers them at COMMIT: see postgres.py). The
        # move (in_flight, a literal in MOVE_ACKED_ITEMS, to sent) is the one counted.
        acked = (sql.CLOSE_ACKED_ATTEMPTS, sql.ADD_ACKED_RECEIPTS, sql.MOVE_ACKED_ITEMS)
        params.update(statements.padding(sql.ACK_FIELDS, len(acks)))
        group = Group(acked, 2, "items.seq", sql.ack_values(statements.padded(len(acks))))
        moved = writes.run(self.engine, group, params)
        self.core.each_event(run_id, ItemTrigger.ACK.value, details, at)
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
        shape = sql.claimable(self.suppressions.on_list(), len(exclude_channels), len(exclude_seqs))
        params: dict[str, Any] = {"run_id": run_id, "at": at, "limit": limit}
        params.update(statements.bound("channel", exclude_channels))
        params.update(statements.bound("held", exclude_seqs))
        rows = self._claimable(run_id, shape, params, at)
        if not rows:
            return []
        waited: list[float | None] = []
        for row in rows:
            last = None
            if row.attempts:
                last = self.engine.execute(
                    sql.LAST_ATTEMPT_FINISHED, {"run_id": run_id, "seq": row.seq}
                ).fetchone()
            seconds = None
            if last and last[0]:
                seconds = (clock.parse(at) - clock.parse(last[0])).total_seconds()
            waited.append(seconds)
        # The claim as set-based statements (see _record_acks): every row was read pending
        # in this transaction, and the move (pending, a literal in claim_items) is still
        # conditional on it.
        current = ItemState.PENDING
        target = item_next(ItemTrigger.START, current)
        detail = {"from": current.value, "to": target.value}
        seqs = [row.seq for row in rows]
        moves: dict[str, Any] = {"run_id": run_id, "at": at, "target": target.value,
                                 "worker_id": self.core.worker_id}  # fmt: skip
        for i, (seq, seconds) in enumerate(zip(seqs, waited, strict=True)):
            moves[f"seq{i}"] = seq
            moves[f"waited{i}"] = seconds
        moves.update(statements.padding(("seq", "waited"), len(seqs)))
        width = statements.padded(len(seqs))
        claim = (sql.claim_items(width), sql.open_attempts(width))
        moved = writes.run(self.engine, Group(claim, 0), moves)
        self.core.events(run_id, "start", seqs if moved.seqs is None else moved.seqs, detail, at)
        if moved.rowcount != len(seqs):  # raised inside the transaction: every write is undone
            raise LostRace(f"run {run_id}: expected {len(seqs)} items pending for start")
        # The items as the move left them.
        return [
            item_from_row(row, state=target, attempts=row.attempts + 1, next_attempt_at=None)
            for row in rows
        ]

    def _claimable(self, run_id: str, shape: str, params: dict[str, Any], at: str) -> list[Any]:
        """Up to `%(limit)s` pending rows that `shape` (statements.claimable) reads that may
        be claimed now, locked as claims lock theirs. Read again while the suppression check
        moves some out of pending, or a closed window gives some a later not_before: rows
        left out so must not stand in for the due rows after them (a claim of none reads as
        "nothing may start now")."""
        reopened: set[int] = set()
        while True:
            found = self.engine.execute(shape, params).fetchall()
            gone = self.suppressions.suppressed_claims(run_id, found, at) if found else set()
            rows = [row for row in found if row.seq not in gone]
            if gone:
                continue
            kept = waiting.keep_open(self.core, run_id, rows, at)
            dropped = {row.seq for row in rows} - {row.seq for row in kept}
            if not dropped or dropped <= reopened:  # the latter: no progress, never a spin
                return kept
            reopened |= dropped

    def _record_one(self, run_id: str, o: Outcome, at: str) -> None:
        if o.attempt_outcome is not None:
            self.engine.execute(
                sql.CLOSE_ATTEMPT,
                {
                    "finished_at": o.finished_at or at,
                    "outcome": _stored(o.attempt_outcome),
                    "http_status": o.http_status,
                    "error": o.error,
                    "retry_after_s": o.retry_after_s,
                    "started_at": o.started_at,
                    "run_id": run_id,
                    "seq": o.seq,
                },
            )
        sets: dict[str, Any] = {"next_attempt_at": o.next_attempt_at}
        if o.error is not None or o.trigger in (
            ItemTrigger.ACK,
            ItemTrigger.FOUND,
            ItemTrigger.MARK_SENT,
        ):
            sets["last_error"] = o.error
        if o.gate_until is not None:
            self.engine.execute(
                sql.CLOSE_GATE, {"closed_until": o.gate_until, "run_id": run_id, "seq": o.seq}
            )
        if o.receipt_source is not None:
            sets["receipt_id"] = o.receipt_id
            self.engine.execute(
                sql.ADD_RECEIPT,
                {"receipt_id": o.receipt_id, "source": o.receipt_source, "evidence": o.evidence,
                 "at": at, "run_id": run_id, "seq": o.seq},
            )  # fmt: skip
        if o.trigger == ItemTrigger.RELEASE:
            # Claimed but never started: it does not count as an attempt (the move below is
            # conditional on in_flight, so a lost race rolls this back too).
            self.engine.execute(sql.UNCOUNT_ATTEMPT, {"run_id": run_id, "seq": o.seq})
        current = o.expected
        if current is None:
            (state,) = self.engine.execute(
                sql.ITEM_STATE, {"run_id": run_id, "seq": o.seq}
            ).fetchone()
            current = ItemState(state)
        self.core.move_item(run_id, o.seq, current, o.trigger, at, also=_written(o, at), **sets)

    def record_decision(
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
            self._audit_decision(run_id, seq, trigger, operator, evidence, at)
            source = "manual" if trigger == ItemTrigger.MARK_SENT else None
            # An abandoned item is failed, yet maybe delivered: its reports say so. One marked
            # not sent is sent again: its reports say so, not the uncertain answer before.
            error = {
                ItemTrigger.ABANDON: f"abandoned by {operator}, maybe delivered: {evidence}",
                ItemTrigger.MARK_NOT_SENT: _marked_not_sent(operator, evidence),
            }.get(trigger)
            self._record_one(
                run_id,
                Outcome(seq, trigger, error=error, receipt_source=source, evidence=evidence),
                at,
            )

    def release_abandoned(
        self, run_id: str, seq: int, operator: str, evidence: str, lease_version: int
    ) -> None:
        """An operator's `--mark not-sent` on an item abandoned earlier: the decision and its
        event, no move. The item stays failed, now known never delivered, so sending the file
        again plans its row (statements.abandoned reads the newest decision); its run may be
        completed, which holds no pending item. Its last error says so, no longer "maybe
        delivered" (the event carries it, for the replay). LostRace if it is not abandoned
        (any more)."""
        at = clock.now_iso()
        trigger = ItemTrigger.MARK_NOT_SENT
        error = _marked_not_sent(operator, evidence)
        with self.core.write(run_id, lease_version):
            (still,) = self.engine.execute(
                statements.ITEM_ABANDONED, {"run_id": run_id, "seq": seq}
            ).fetchone()
            if not still:
                raise LostRace(f"run {run_id}: item {seq} is no longer abandoned")
            self._audit_decision(run_id, seq, trigger, operator, evidence, at, error)
            self.engine.execute(
                sql.NOTE_RELEASED, {"error": error, "at": at, "run_id": run_id, "seq": seq}
            )

    def _audit_decision(
        self,
        run_id: str,
        seq: int,
        trigger: ItemTrigger,
        operator: str,
        evidence: str,
        at: str,
        last_error: str | None = None,
    ) -> None:
        """An operator's decision's audit row and its event (inside the caller's write);
        `last_error`: the item's new last error, where the decision sets it without a move."""
        self.engine.execute(
            sql.ADD_DECISION,
            {"run_id": run_id, "seq": seq, "operator": operator, "at": at,
             "decision": trigger, "evidence": evidence},
        )  # fmt: skip
        detail = {"decision": trigger, "operator": operator, "evidence": evidence}
        if last_error is not None:
            detail["last_error"] = last_error
        self.core.event(run_id, "decision", seq, detail, at)

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
                self.core.move_run(run_id, RunTrigger.APPROVE, at, approval=as_json(approval))
                return
            cursor = self.engine.execute(
                sql.RENEW_APPROVAL,
                {"approval": as_json(approval), "at": at, "run_id": run_id,
                 "state": run.state.value},
            )  # fmt: skip
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
                run_id,
                RunTrigger.REJECT,
                at,
                stop_reason=f"rejected by {operator}: {reason}",
                stop_cause=StopCause.REJECTED,
            )
            self.core.event(
                run_id, "rejected", None, {"operator": operator, "at": at, "reason": reason}, at
            )

    def state_version(self, run_id: str) -> int:
        """The run's state version: the number of its last event. Every state move and
        every item outcome appends one, so an approval bound to it names one exact state."""
        row = self.engine.execute(statements.LAST_EVENT, {"run_id": run_id}).fetchone()
        return int(row[0] or 0)

    def request_cancel(self, run_id: str) -> bool:
        """Flag the run for cancel; False (nothing written) when it already finished, e.g. a
        worker completed it between the caller's read and this write."""
        at = clock.now_iso()
        try:
            return self._flag_cancel(run_id, at, with_event=True)
        except AuditKeyMismatch:
            # A process without the run's audit key cannot link an event into its chain, but
            # a cancel is never refused for want of a key: the flag alone, which every worker
            # reads, and the worker that stops (holding the key) records the run's end.
            return self._flag_cancel(run_id, at, with_event=False)

    def _flag_cancel(self, run_id: str, at: str, *, with_event: bool) -> bool:
        with self.core.write():
            cursor = self.engine.execute(sql.REQUEST_CANCEL, {"at": at, "run_id": run_id})
            if cursor.rowcount != 1:
                return False
            if with_event:
                self.core.event(run_id, "cancel_requested", None, None, at)
        return True


def _written(o: Outcome, at: str) -> dict[str, Any]:
    """The attempt closed and the receipt stored for `o`, as its event carries them: the
    columns CLOSE_ATTEMPT (or CLOSE_ACKED_ATTEMPTS) and ADD_RECEIPT write, so that replay.py
    rebuilds both rows from the event alone."""
    written: dict[str, Any] = {}
    if o.attempt_outcome is not None:
        written["attempt"] = {
            "finished_at": o.finished_at or at, "outcome": _stored(o.attempt_outcome),
            "http_status": o.http_status, "error": o.error, "retry_after_s": o.retry_after_s,
            "started_at": o.started_at,
        }  # fmt: skip
    if o.receipt_source is not None:
        written["receipt"] = {"id": o.receipt_id, "source": o.receipt_source,
                              "evidence": o.evidence}  # fmt: skip
    return written


def _stored(outcome: AttemptOutcome | None) -> str | None:
    """An attempt's outcome as `attempts.outcome` holds it: the enum's value."""
    return None if outcome is None else AttemptOutcome(outcome).value


def _marked_not_sent(operator: str, evidence: str) -> str:
    """The last error of an item an operator marked not sent: it is sent again (or its row
    planned again), never reported maybe delivered."""
    return f"marked not sent by {operator}: {evidence}"
