"""The statements of store/queries.py (their notation: statements/__init__.py)."""

from __future__ import annotations

from collections.abc import Sequence

from notifier.domain.records import NEVER_LEFT
from notifier.domain.state_machine import ACTIVE_ITEM_STATES, ItemState
from notifier.store.statements import (
    ACTIVE,
    ATTENTION,
    ATTENTION_STATES,
    DISPROVED,
    DUE,
    MAYBE_DELIVERED,
    abandoned,
    listed,
    state_literal,
)

RUNS_WITH_FINGERPRINT = (
    "SELECT * FROM runs WHERE fingerprint = %(fingerprint)s ORDER BY created_at DESC, rowid DESC"
)
RUN_FLAGS = "SELECT cancel_requested_at, lease_version FROM runs WHERE run_id = %(run_id)s"
# The run's cancel request and state, and one worker's lease version while it is live.
WORKER_SIGNALS = (
    "SELECT r.cancel_requested_at, r.state, (SELECT w.version FROM workers w "
    "WHERE w.worker_id = %(worker_id)s AND w.state = 'live') AS version "
    "FROM runs r WHERE r.run_id = %(run_id)s"
)
# Items per state from m004's counters; before m004 (opened read-only), counted row by row.
RUN_COUNTS = "SELECT state, n FROM run_counts WHERE run_id = %(run_id)s"
ITEM_COUNTS = "SELECT state, COUNT(*) FROM items WHERE run_id = %(run_id)s GROUP BY state"
PER_CHANNEL = "SELECT channel, COUNT(*) FROM items WHERE run_id = %(run_id)s GROUP BY channel"
ITEMS = "SELECT * FROM items WHERE run_id = %(run_id)s ORDER BY seq"


def items_in_states(states: Sequence[ItemState]) -> str:
    """A run's items in one of `states` (bound as `%(s0)s`…), by seq. Repeating a partial
    index's own condition lets SQLite use it: the attention index for in_flight/unknown/
    failed (never a walk over a million pending items), else the active one."""
    if all(s in ATTENTION_STATES for s in states):
        among = f"{{indexed_items_attention}} WHERE run_id = %(run_id)s AND {ATTENTION}"
    elif all(s in ACTIVE_ITEM_STATES for s in states):
        among = f"WHERE run_id = %(run_id)s AND {ACTIVE}"
    else:
        among = "WHERE run_id = %(run_id)s"
    return f"SELECT * FROM items {among} AND state IN ({listed('s', len(states))}) ORDER BY seq"


def items_with_receipts(states: Sequence[ItemState]) -> str:
    """A run's items (in one of `states`, unless none is given) by seq, each with its
    receipt's source and evidence (NULL without one)."""
    chosen = ""
    if states:
        chosen = f" AND i.state IN ({', '.join(state_literal(s) for s in states)})"
    return (
        "SELECT i.*, r.source AS receipt_source, r.evidence AS receipt_evidence "
        "FROM items i LEFT JOIN receipts r ON r.idempotency_key = i.idempotency_key "
        f"WHERE i.run_id = %(run_id)s{chosen} ORDER BY i.seq"
    )


ITEM = "SELECT * FROM items WHERE run_id = %(run_id)s AND seq = %(seq)s"
ITEM_BY_ID = "SELECT * FROM items WHERE run_id = %(run_id)s AND item_id = %(item_id)s"
# Per channel, the latest next_attempt_at of a pending item whose last attempt was throttled;
# through items_waiting and attempts_throttled (m004): only the waiting and throttled rows.
THROTTLED_WAITING = (
    "SELECT i.channel, MAX(i.next_attempt_at) FROM items i "
    "WHERE i.run_id = %(run_id)s AND i.state = 'pending' "
    "AND i.next_attempt_at IS NOT NULL AND (SELECT a.outcome FROM attempts a "
    "WHERE a.run_id = i.run_id AND a.seq = i.seq ORDER BY a.n DESC LIMIT 1) "
    "= 'throttled' GROUP BY i.channel"
)
# Every throttled attempt that asked its channel to wait, and for how long.
THROTTLED_ATTEMPTS = (
    "SELECT i.channel, a.finished_at, a.retry_after_s FROM attempts a "
    "JOIN items i ON i.run_id = a.run_id AND i.seq = a.seq "
    "WHERE a.run_id = %(run_id)s AND a.outcome = 'throttled' AND a.finished_at IS NOT NULL "
    "AND a.retry_after_s IS NOT NULL ORDER BY a.run_id, a.seq"
)
# When the run's last request on a channel that may have left started (not released
# unstarted, not expired at its claim): a new process's --rate and domain_rates buckets
# start from there, not full. An attempt still open (its process killed) holds its claim's
# time, not the moment its request left, which may be as late as now: it counts as now.
LAST_START = (
    "SELECT MAX(CASE WHEN a.finished_at IS NULL THEN %(now)s ELSE a.started_at END) "
    "FROM attempts a "
    "JOIN items i ON i.run_id = a.run_id AND i.seq = a.seq "
    "WHERE a.run_id = %(run_id)s AND i.channel = %(channel)s "
    "AND (a.outcome IS NULL OR a.outcome NOT IN ({}))".format(
        ", ".join(f"'{o.value}'" for o in sorted(NEVER_LEFT))
    )
)
CHANNEL_GATES = "SELECT channel, closed_until FROM channel_gates WHERE run_id = %(run_id)s"
# The earliest deadline still ahead of `%(at)s` among the run's pending items: one probe of
# items_deadline (m003), never a walk over the pending items.
NEXT_DEADLINE = (
    "SELECT MIN(not_after) FROM items WHERE run_id = %(run_id)s AND state = 'pending' "
    "AND not_after IS NOT NULL AND not_after > %(at)s"
)
# Through m004's items_retried and events_disproof: only the retried items, and only the
# disproving events of each, are read (never every pending item or every event). Named,
# because without statistics SQLite prefers items_pending_channel, which holds every pending
# item: 0.45 s on a run of a million not yet started.
PENDING_KINDS = (
    f"SELECT i.seq, {MAYBE_DELIVERED} FROM items i {{indexed_items_retried}} "
    "WHERE i.run_id = %(run_id)s AND i.state = 'pending' AND i.attempts > 0"
)

# The run's failed items an operator abandoned (statements.abandoned), found from its
# decisions: a run has a handful of them, while every one of its items may have failed
# (`ordered_join`: SQLite would otherwise start from the run's items).
ABANDONED_SEQS = (
    "SELECT DISTINCT i.seq FROM decisions d {ordered_join} items i "
    "ON i.run_id = d.run_id AND i.seq = d.seq "
    f"WHERE d.run_id = %(run_id)s AND d.decision = 'abandon' AND {abandoned('i')}"
)


def maybe_delivered_among(n: int) -> str:
    """Those of a run's n items (`%(s0)s`…) that may have reached their recipient."""
    return (
        f"SELECT i.seq FROM items i WHERE i.run_id = %(run_id)s AND i.seq IN ({listed('s', n)}) "
        f"AND {MAYBE_DELIVERED}"
    )


def earliest_pending(windowed: bool) -> str:
    """Per channel, the earliest next_attempt_at of the run's pending items ('' for due
    now) that are due at `%(at)s` (all of them, not `windowed`: before m009, no start
    times); one pass over them, where no index serves a probe per channel."""
    due = DUE if windowed else "1 = 1"
    return (
        "SELECT channel, MIN(COALESCE(next_attempt_at, '')) FROM items "
        f"WHERE run_id = %(run_id)s AND {ACTIVE} AND state = 'pending' AND {due} "
        "GROUP BY channel"
    )


def first_pending(windowed: bool) -> str:
    """The earliest next_attempt_at of the channel's pending items due at `%(at)s` (NULL,
    due now, sorts first): one probe of items_pending_channel."""
    due = DUE if windowed else "1 = 1"
    return (
        "SELECT next_attempt_at FROM items {indexed_items_pending_channel} "
        f"WHERE run_id = %(run_id)s AND state = 'pending' AND channel = %(channel)s AND {due} "
        "ORDER BY next_attempt_at LIMIT 1"
    )


def waiting_for_query(due_by: bool, worker: bool) -> str:
    """A run's unknown items waiting for their channel's query_delay; with `due_by`, those due
    by `%(due_by)s`; with `worker`, those of `%(worker_id)s`. items_attention (m004) holds
    the unknown items: never a walk over the pending ones."""
    return (
        "SELECT * FROM items {indexed_items_attention} WHERE run_id = %(run_id)s "
        f"AND {ATTENTION} AND state = 'unknown' AND next_attempt_at IS NOT NULL"
        + (" AND next_attempt_at <= %(due_by)s" if due_by else "")
        + (" AND worker_id = %(worker_id)s" if worker else "")
        + " ORDER BY seq"
    )


def attempts(of_one: bool) -> str:
    """A run's attempts (`of_one`: of the item `%(seq)s`), in the order made, each with
    whether it was disproved (records.Attempt)."""
    return (
        "SELECT a.seq, a.n, a.started_at, a.finished_at, a.outcome, a.http_status, a.error, "
        f"a.waited_s, a.retry_after_s, {DISPROVED} AS disproved FROM attempts a "
        "WHERE a.run_id = %(run_id)s"
        + (" AND a.seq = %(seq)s" if of_one else "")
        + " ORDER BY a.id"
    )


# One pass over the run's attempts (their unique index leads with run_id).
ATTEMPT_TALLY = (
    "SELECT i.channel, a.outcome, COUNT(*) FROM attempts a JOIN items i "
    "ON i.run_id = a.run_id AND i.seq = a.seq "
    "WHERE a.run_id = %(run_id)s AND a.outcome IS NOT NULL GROUP BY i.channel, a.outcome"
)
DECISIONS = (
    "SELECT d.seq, i.item_id, d.operator, d.at, d.decision, d.evidence "
    "FROM decisions d JOIN items i ON i.run_id = d.run_id AND i.seq = d.seq "
    "WHERE d.run_id = %(run_id)s ORDER BY d.id"
)
