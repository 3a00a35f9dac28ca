"""Queries: what status, report, resume and the runner read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from notifier.domain import clock, waits
from notifier.domain.records import (
    Attempt,
    AttemptOutcome,
    Counts,
    Item,
    ManualDecision,
    PendingKind,
    Run,
    item_from_row,
    run_from_row,
)
from notifier.domain.state_machine import ItemState, RunState
from notifier.store import statements
from notifier.store import waiting as _waiting
from notifier.store.core import Core
from notifier.store.statements import queries as sql


class Queries:
    """Reading runs, items and their history, through indexes on what needs attention."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.engine = core.engine

    # ---------------------------------------------------------------- reading

    def newest_run(self, exclude: Sequence[RunState] = ()) -> Run | None:
        for run in self.core.runs():
            if run.state not in exclude:
                return run
        return None

    def runs_with_fingerprint(self, fingerprint: str) -> list[Run]:
        """Runs with this approval fingerprint (content + channel definitions), newest first."""
        rows = self.engine.execute(sql.RUNS_WITH_FINGERPRINT, {"fingerprint": fingerprint})
        return [run_from_row(r) for r in rows]

    def runs_with_content_fingerprint(self, content_fingerprint: str) -> list[Run]:
        """Runs that planned the same content (digests + channel names), newest first. For
        display only (`--dry-run`): the decision is taken inside create_run."""
        return self.core.runs_with_content_fingerprint(content_fingerprint)

    def run_flags(self, run_id: str) -> tuple[str | None, int]:
        """The two things a worker polls between windows: cancel request and lease version."""
        row = self.engine.execute(sql.RUN_FLAGS, {"run_id": run_id}).fetchone()
        return row.cancel_requested_at, row.lease_version

    def worker_signals(
        self, run_id: str, worker_id: str
    ) -> tuple[str | None, RunState, int | None]:
        """What a worker of a shared run polls between turns, in one read: the cancel
        request, the run's state (another worker may have halted, paused or closed it), and
        the version of `worker_id`'s own lease (None once it is no longer live): a worker
        learns of its reap at its next look, not at its next renewal."""
        cancel_requested_at, state, version = self.engine.execute(
            sql.WORKER_SIGNALS, {"run_id": run_id, "worker_id": worker_id}
        ).fetchone()
        return cancel_requested_at, RunState(state), version

    def counts(self, run_id: str) -> Counts:
        """Items per state, from the counters m004's triggers keep with every move: one
        indexed read of at most one row per state, whatever the size of the run."""
        # Without m004's counters (a file opened read-only before it was applied), the rows
        # are counted.
        counters = self.engine.has_table("run_counts")
        statement = sql.RUN_COUNTS if counters else sql.ITEM_COUNTS
        by_state = dict(self.engine.execute(statement, {"run_id": run_id}).fetchall())
        # Only a run with failed items can have abandoned ones: the others pay no read.
        failed = by_state.get(ItemState.FAILED.value, 0)
        abandoned = len(self.abandoned_seqs(run_id)) if failed else 0
        return Counts.of(by_state, abandoned)

    def per_channel(self, run_id: str) -> dict[str, int]:
        """Items per channel (one pass over the run's rows: for a plan some of whose rows
        were left out, not for every status)."""
        rows = self.engine.execute(sql.PER_CHANNEL, {"run_id": run_id})
        return {name: int(n) for name, n in rows.fetchall()}

    def items(self, run_id: str, states: Sequence[ItemState] | None = None) -> Iterator[Item]:
        cursor: Iterable[Any]
        if states is None:
            cursor = self.engine.stream(sql.ITEMS, {"run_id": run_id})
        else:
            cursor = self.engine.execute(
                sql.items_in_states(states),
                {"run_id": run_id, **statements.bound("s", [s.value for s in states])},
            )
        for row in cursor:
            yield item_from_row(row)

    def items_with_receipts(
        self, run_id: str, states: Sequence[ItemState] | None = None
    ) -> Iterator[tuple[Item, str | None, str | None]]:
        """Every item in seq order (with `states`, those in one of them) with its receipt's
        source and evidence (None without one), read as the caller goes: the full report
        streams from this cursor."""
        cursor = self.engine.stream(sql.items_with_receipts(states or ()), {"run_id": run_id})
        for row in cursor:
            yield item_from_row(row), row.receipt_source, row.receipt_evidence

    def item(self, run_id: str, seq: int) -> Item:
        row = self.engine.execute(sql.ITEM, {"run_id": run_id, "seq": seq}).fetchone()
        if row is None:
            raise KeyError(seq)
        return item_from_row(row)

    def abandoned(self, run_id: str, seq: int) -> bool:
        """Whether an operator abandoned the item (statements.abandoned): maybe delivered."""
        row = self.engine.execute(
            statements.ITEM_ABANDONED, {"run_id": run_id, "seq": seq}
        ).fetchone()
        return bool(row and row[0])

    def item_by_id(self, run_id: str, item_id: str) -> Item | None:
        row = self.engine.execute(sql.ITEM_BY_ID, {"run_id": run_id, "item_id": item_id}).fetchone()
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

        for channel, moment in self.engine.execute(sql.THROTTLED_WAITING, {"run_id": run_id}):
            later(channel, moment)
        for channel, finished_at, wait_s in self.engine.execute(
            sql.THROTTLED_ATTEMPTS, {"run_id": run_id}
        ):
            # As the retry policy waited it (the test switch scales both: waits.py).
            later(channel, clock.iso(clock.later(waits.scaled(wait_s), clock.parse(finished_at))))
        return until

    def last_start(self, run_id: str, channel: str) -> str | None:
        """When the run's last request on `channel` that may have left started; None: none."""
        (started,) = self.engine.execute(
            sql.LAST_START, {"run_id": run_id, "channel": channel, "now": clock.now_iso()}
        ).fetchone()
        return None if started is None else str(started)

    def next_deadline(self, run_id: str) -> str | None:
        """The earliest `not_after` still ahead among the run's pending items; None: none."""
        (first,) = self.engine.execute(
            sql.NEXT_DEADLINE, {"run_id": run_id, "at": clock.now_iso()}
        ).fetchone()
        return None if first is None else str(first)

    def channel_gates(self, run_id: str) -> dict[str, str]:
        """Per channel, until when a throttled answer (of any worker) closed it: one row per
        channel, read by every worker of a shared run several times a second."""
        return dict(self.engine.execute(sql.CHANNEL_GATES, {"run_id": run_id}).fetchall())

    def pending_kinds(self, run_id: str) -> dict[int, PendingKind]:
        """seq → kind for every pending item that was attempted (the others were never
        attempted). An attempt whose outcome was uncertain (timeout, 5xx, 409 in progress,
        a stop mid-request: records.maybe_delivered) may have been delivered unless a later
        query (`not_found`) or an operator (`mark_not_sent`) proved otherwise; a throttled
        or refused one was not."""
        rows = self.engine.execute(sql.PENDING_KINDS, {"run_id": run_id})
        return {
            seq: PendingKind.MAYBE_DELIVERED if maybe_delivered else PendingKind.RETRY_WAITING
            for seq, maybe_delivered in rows
        }

    def abandoned_seqs(self, run_id: str) -> set[int]:
        """The seqs of the run's items an operator abandoned (failed, yet maybe delivered:
        statements.abandoned), not since marked not sent."""
        return {seq for (seq,) in self.engine.execute(sql.ABANDONED_SEQS, {"run_id": run_id})}

    def maybe_delivered(self, run_id: str, seqs: Sequence[int]) -> set[int]:
        """Those of `seqs` that may have reached their recipient (statements.MAYBE_DELIVERED)."""
        rows = self.engine.execute(
            sql.maybe_delivered_among(len(seqs)), {"run_id": run_id, **statements.bound("s", seqs)}
        )
        return {seq for (seq,) in rows}

    def pending_by_channel(self, run_id: str) -> list[tuple[str, str | None]]:
        """Per channel with pending items: the earliest next_attempt_at (None: due now), or
        when an item still waiting for its start time or window (store/waiting.py) is due,
        whichever comes first."""
        at = clock.now_iso()
        # A file before m009 (opened read-only) has no start times: every item is due.
        windowed = "not_before" in self.engine.columns("items")
        if not self.engine.indexed("items_pending_channel"):
            # PostgreSQL, or a file older than m004 opened read-only
            earliest = {
                channel: first or None
                for channel, first in self.engine.execute(
                    sql.earliest_pending(windowed), {"run_id": run_id, "at": at}
                )
            }
        else:
            # One index probe per channel of the run (NULL, due now, sorts first), never a
            # walk over its pending items.
            earliest = {}
            for channel in sorted(self.core.get_run(run_id).channel_snapshot):
                row = self.engine.execute(
                    sql.first_pending(windowed), {"run_id": run_id, "channel": channel, "at": at}
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
        if "not_before" not in self.engine.columns("items"):
            return _waiting.Waiting(0, None)
        return _waiting.waiting(self.core.engine, run_id, clock.now_iso())

    def waiting_for_query(self, run_id: str, due_by: str | None = None) -> list[Item]:
        """Unknown items that wait for their channel's query_delay before a 404 may count
        (next_attempt_at = when to ask again); with `due_by`, only those due by then."""
        # On a shared run, each worker revisits the items it holds (its own, or adopted from
        # a dead worker), never another live worker's.
        worker_id = self.core.worker_id
        rows = self.engine.execute(
            sql.waiting_for_query(due_by is not None, worker_id is not None),
            {"run_id": run_id, "due_by": due_by, "worker_id": worker_id},
        )
        return [item_from_row(r) for r in rows]

    def attempts(self, run_id: str, seq: int | None = None) -> list[Attempt]:
        rows = self.engine.execute(sql.attempts(seq is not None), {"run_id": run_id, "seq": seq})
        return [_attempt(r) for r in rows]

    def attempt_tally(self, run_id: str) -> list[tuple[str, str, int]]:
        """(channel, outcome, count) of the run's finished attempts, for `notifier metrics`:
        one pass over the run's attempts (its unique index leads with run_id)."""
        rows = self.engine.execute(sql.ATTEMPT_TALLY, {"run_id": run_id})
        return [(str(channel), str(outcome), int(n)) for channel, outcome, n in rows]

    def decisions(self, run_id: str) -> list[ManualDecision]:
        return [
            ManualDecision(*tuple(r))
            for r in self.engine.execute(sql.DECISIONS, {"run_id": run_id})
        ]


def _attempt(r: Any) -> Attempt:
    outcome = None if r.outcome is None else AttemptOutcome(r.outcome)
    return Attempt(
        r.seq, r.n, r.started_at, r.finished_at, outcome, r.http_status, r.error, r.waited_s,
        r.retry_after_s, bool(r.disproved),
    )  # fmt: skip
