"""Queries: what status, report, resume and the runner read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .. import clock, waits
from ..records import (
    Attempt,
    Counts,
    Decision,
    Item,
    PendingKind,
    Run,
    item_from_row,
    run_from_row,
)
from ..state_machine import (
    ItemState,
    RunState,
)
from . import waiting as _waiting
from .core import Core, _all_active
from .statements import ACTIVE as _ACTIVE
from .statements import ATTENTION as _ATTENTION
from .statements import ATTENTION_STATES, MAYBE_DELIVERED
from .statements import state_literal as _state_literal


class Queries:
    """Reading runs, items and their history, through indexes on what needs attention."""

    def __init__(self, core: Core) -> None:
        self.core = core

    # ---------------------------------------------------------------- reading

    def newest_run(self, exclude: Sequence[RunState] = ()) -> Run | None:
        for run in self.core.runs():
            if run.state not in exclude:
                return run
        return None

    def runs_with_fingerprint(self, fingerprint: str) -> list[Run]:
        """Runs with this approval fingerprint (content + channel definitions), newest first."""
        rows = self.core.conn.execute(
            "SELECT * FROM runs WHERE fingerprint = ? ORDER BY created_at DESC, rowid DESC",
            (fingerprint,),
        )
        return [run_from_row(r) for r in rows]

    def runs_with_content_fingerprint(self, content_fingerprint: str) -> list[Run]:
        """Runs that planned the same content (digests + channel names), newest first. For
        display only (`--dry-run`): the decision is taken inside create_run."""
        return self.core.runs_with_content_fingerprint(content_fingerprint)

    def run_flags(self, run_id: str) -> tuple[str | None, int]:
        """The two things a worker polls between windows: cancel request and lease version."""
        row = self.core.conn.execute(
            "SELECT cancel_requested_at, lease_version FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return row[0], row[1]

    def run_signals(self, run_id: str) -> tuple[str | None, RunState]:
        """What a worker of a shared run polls between turns, in one read: the cancel
        request, and the run's state (another worker may have halted, paused or closed it)."""
        cancel_requested_at, state = self.core.conn.execute(
            "SELECT cancel_requested_at, state FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return cancel_requested_at, RunState(state)

    def counts(self, run_id: str) -> Counts:
        """Items per state, from the counters m004's triggers keep with every move: one
        indexed read of at most one row per state, whatever the size of the run."""
        if self.core.engine.has_table("run_counts"):
            sql = "SELECT state, n FROM run_counts WHERE run_id = ?"
        else:  # opened read-only before m004 was applied: count the rows
            sql = "SELECT state, COUNT(*) FROM items WHERE run_id = ? GROUP BY state"
        return Counts.of(dict(self.core.conn.execute(sql, (run_id,)).fetchall()))

    def per_channel(self, run_id: str) -> dict[str, int]:
        """Items per channel (one pass over the run's rows: for a plan some of whose rows
        were left out, not for every status)."""
        sql = "SELECT channel, COUNT(*) FROM items WHERE run_id = ? GROUP BY channel"
        return {name: int(n) for name, n in self.core.conn.execute(sql, (run_id,)).fetchall()}

    def items(self, run_id: str, states: Sequence[ItemState] | None = None) -> Iterator[Item]:
        if states is None:
            cursor = self.core.engine.stream(
                "SELECT * FROM items WHERE run_id = ? ORDER BY seq", (run_id,)
            )
        else:
            marks = ", ".join("?" * len(states))
            # Repeating a partial index's own condition lets SQLite use it: the attention
            # index for in_flight/unknown/failed (never a walk over a million pending items),
            # else the active one.
            indexed = ""
            if all(s in ATTENTION_STATES for s in states):
                active, indexed = _ATTENTION, self.core.engine.indexed("items_attention")
            elif _all_active(states):
                active = _ACTIVE
            else:
                active = "1"
            cursor = self.core.conn.execute(
                f"SELECT * FROM items {indexed} WHERE run_id = ? AND {active} "
                f"AND state IN ({marks}) "
                "ORDER BY seq",
                (run_id, *[s.value for s in states]),
            )
        for row in cursor:
            yield item_from_row(row)

    def items_with_receipts(
        self, run_id: str, states: Sequence[ItemState] | None = None
    ) -> Iterator[tuple[Item, str | None, str | None]]:
        """Every item in seq order (with `states`, those in one of them) with its receipt's
        source and evidence (None without one), read as the caller goes: the full report
        streams from this cursor."""
        chosen = ""
        if states:
            chosen = f" AND i.state IN ({', '.join(_state_literal(s) for s in states)})"
        cursor = self.core.engine.stream(
            "SELECT i.*, r.source AS receipt_source, r.evidence AS receipt_evidence "
            "FROM items i LEFT JOIN receipts r ON r.idempotency_key = i.idempotency_key "
            f"WHERE i.run_id = ?{chosen} ORDER BY i.seq",
            (run_id,),
        )
        for row in cursor:
            yield item_from_row(row), row.receipt_source, row.receipt_evidence

    def item(self, run_id: str, seq: int) -> Item:
        row = self.core.conn.execute(
            "SELECT * FROM items WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()
        if row is None:
            raise KeyError(seq)
        return item_from_row(row)

    def item_by_id(self, run_id: str, item_id: str) -> Item | None:
        row = self.core.conn.execute(
            "SELECT * FROM items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
        ).fetchone()
        return item_from_row(row) if row else None

    def throttled_until(self, run_id: str) -> dict[str, str]:
        """Per channel, the latest time a downstream asked us to stay away, so a new process
        honours a Retry-After that an earlier one was given: a pending item whose last attempt
        was throttled waits until its next_attempt_at, and any throttled attempt (also one
        that ended its item) asked the channel to wait retry_after_s from its answer."""
        until: dict[str, str] = {}

        def later(channel: str, moment: str) -> None:
            if moment > until.get(channel, ""):
                until[channel] = moment

        # items_waiting and attempts_throttled (m004): only the waiting and throttled rows.
        for channel, moment in self.core.conn.execute(
            "SELECT i.channel, MAX(i.next_attempt_at) FROM items i "
            "WHERE i.run_id = ? AND i.state = 'pending' "
            "AND i.next_attempt_at IS NOT NULL AND (SELECT a.outcome FROM attempts a "
            "WHERE a.run_id = i.run_id AND a.seq = i.seq ORDER BY a.n DESC LIMIT 1) "
            "= 'throttled' GROUP BY i.channel",
            (run_id,),
        ):
            later(channel, moment)
        for channel, finished_at, wait_s in self.core.conn.execute(
            "SELECT i.channel, a.finished_at, a.retry_after_s FROM attempts a "
            "JOIN items i ON i.run_id = a.run_id AND i.seq = a.seq "
            "WHERE a.run_id = ? AND a.outcome = 'throttled' AND a.finished_at IS NOT NULL "
            "AND a.retry_after_s IS NOT NULL ORDER BY a.run_id, a.seq",
            (run_id,),
        ):
            # As the retry policy waited it (the test switch scales both: waits.py).
            later(channel, clock.iso(clock.later(waits.scaled(wait_s), clock.parse(finished_at))))
        return until

    def channel_gates(self, run_id: str) -> dict[str, str]:
        """Per channel, until when a throttled answer (of any worker) closed it: one row per
        channel, read by every worker of a shared run several times a second."""
        return dict(
            self.core.conn.execute(
                "SELECT channel, closed_until FROM channel_gates WHERE run_id = ?", (run_id,)
            ).fetchall()
        )

    def pending_kinds(self, run_id: str) -> dict[int, PendingKind]:
        """seq → kind for every pending item that was attempted (the others were never
        attempted). An attempt whose outcome was uncertain (timeout, 5xx, 409 in progress,
        a stop mid-request) may have been delivered unless a later query (`not_found`) or an
        operator (`mark_not_sent`) proved otherwise; a throttled or refused one was not."""
        # Through m004's items_retried and events_disproof: only the retried items, and only
        # the disproving events of each, are read (never every pending item or every event).
        # Named, because without statistics SQLite prefers items_pending_channel, which holds
        # every pending item: 0.45 s on a run of a million not yet started.
        rows = self.core.conn.execute(
            f"SELECT i.seq, {MAYBE_DELIVERED} FROM items i "
            f"{self.core.engine.indexed('items_retried')} "
            "WHERE i.run_id = ? AND i.state = 'pending' AND i.attempts > 0",
            (run_id,),
        )
        return {
            seq: PendingKind.MAYBE_DELIVERED if maybe_delivered else PendingKind.RETRY_WAITING
            for seq, maybe_delivered in rows
        }

    def maybe_delivered(self, run_id: str, seqs: Sequence[int]) -> set[int]:
        """Those of `seqs` that may have reached their recipient (core.MAYBE_DELIVERED)."""
        marks = ", ".join("?" * len(seqs))
        return {
            seq
            for (seq,) in self.core.conn.execute(
                f"SELECT i.seq FROM items i WHERE i.run_id = ? AND i.seq IN ({marks}) "
                f"AND {MAYBE_DELIVERED}",
                (run_id, *seqs),
            )
        }

    def pending_by_channel(self, run_id: str) -> list[tuple[str, str | None]]:
        """Per channel with pending items: the earliest next_attempt_at (None: due now), or
        when an item still waiting for its start time or window (store/waiting.py) is due,
        whichever comes first."""
        at = clock.now_iso()
        # A file before m009 (opened read-only) has no start times: every item is due.
        windowed = "not_before" in self.core.engine.columns("items")
        due, due_at = (
            ("(not_before IS NULL OR not_before <= ?)", (at,)) if windowed else ("1 = 1", ())
        )
        indexed = self.core.engine.indexed("items_pending_channel")
        if not indexed:  # PostgreSQL, or a file older than m004 opened read-only
            earliest = {
                channel: first or None
                for channel, first in self.core.conn.execute(
                    f"SELECT channel, MIN(COALESCE(next_attempt_at, '')) FROM items "
                    f"WHERE run_id = ? AND {_ACTIVE} AND state = 'pending' AND {due} "
                    "GROUP BY channel",
                    (run_id, *due_at),
                )
            }
        else:
            # One index probe per channel of the run (NULL, due now, sorts first), never a
            # walk over its pending items.
            earliest = {}
            for channel in sorted(self.core.get_run(run_id).channel_snapshot):
                row = self.core.conn.execute(
                    f"SELECT next_attempt_at FROM items {indexed} WHERE run_id = ? "
                    f"AND state = 'pending' AND channel = ? AND {due} "
                    "ORDER BY next_attempt_at LIMIT 1",
                    (run_id, channel, *due_at),
                ).fetchone()
                if row is not None:
                    earliest[channel] = row[0] or None
        if not windowed:
            return sorted(earliest.items())
        found: list[tuple[str, str | None]] = []
        for channel in sorted(self.core.get_run(run_id).channel_snapshot):
            if channel in earliest and earliest[channel] is None:
                found.append((channel, None))
                continue
            opening = _waiting.next_opening(self.core.engine, run_id, channel, at)
            times = [t for t in (earliest.get(channel), opening) if t]
            if times:
                found.append((channel, min(times)))
        return found

    def waiting(self, run_id: str) -> _waiting.Waiting:
        """Items waiting for their start time or send window (none in a file before m009)."""
        if "not_before" not in self.core.engine.columns("items"):
            return _waiting.Waiting(0, None)
        return _waiting.waiting(self.core.engine, run_id, clock.now_iso())

    def waiting_for_query(self, run_id: str, due_by: str | None = None) -> list[Item]:
        """Unknown items that wait for their channel's query_delay before a 404 may count
        (next_attempt_at = when to ask again); with `due_by`, only those due by then."""
        # items_attention (m004) holds the unknown items: never a walk over the pending ones.
        sql = (
            f"SELECT * FROM items {self.core.engine.indexed('items_attention')} WHERE run_id = ? "
            f"AND {_ATTENTION} AND state = 'unknown' AND next_attempt_at IS NOT NULL"
        )
        params: list[Any] = [run_id]
        if due_by is not None:
            sql += " AND next_attempt_at <= ?"
            params.append(due_by)
        if self.core.worker_id is not None:
            # On a shared run, each worker revisits the items it holds (its own, or adopted
            # from a dead worker), never another live worker's.
            sql += " AND worker_id = ?"
            params.append(self.core.worker_id)
        return [item_from_row(r) for r in self.core.conn.execute(sql + " ORDER BY seq", params)]

    def attempts(self, run_id: str, seq: int | None = None) -> list[Attempt]:
        sql = (
            "SELECT seq, n, started_at, finished_at, outcome, http_status, error, waited_s, "
            "retry_after_s FROM attempts WHERE run_id = ?"
        )
        params: list[Any] = [run_id]
        if seq is not None:
            sql += " AND seq = ?"
            params.append(seq)
        return [Attempt(*tuple(r)) for r in self.core.conn.execute(sql + " ORDER BY id", params)]

    def attempt_tally(self, run_id: str) -> list[tuple[str, str, int]]:
        """(channel, outcome, count) of the run's finished attempts, for `notifier metrics`:
        one pass over the run's attempts (its unique index leads with run_id)."""
        rows = self.core.conn.execute(
            "SELECT i.channel, a.outcome, COUNT(*) FROM attempts a JOIN items i "
            "ON i.run_id = a.run_id AND i.seq = a.seq "
            "WHERE a.run_id = ? AND a.outcome IS NOT NULL GROUP BY i.channel, a.outcome",
            (run_id,),
        )
        return [(str(channel), str(outcome), int(n)) for channel, outcome, n in rows]

    def decisions(self, run_id: str) -> list[Decision]:
        return [
            Decision(*tuple(r))
            for r in self.core.conn.execute(
                "SELECT d.seq, i.item_id, d.operator, d.at, d.decision, d.evidence "
                "FROM decisions d JOIN items i ON i.run_id = d.run_id AND i.seq = d.seq "
                "WHERE d.run_id = ? ORDER BY d.id",
                (run_id,),
            )
        ]
