"""The statements of store/plans.py (their notation: statements/__init__.py)."""

from __future__ import annotations

RUN_EXISTS = "SELECT 1 FROM runs WHERE run_id = %(run_id)s"
# What names each item and when it may be sent, in seq order (intent.Identities,
# intent.Schedules): chained when the items are stored.
ITEMS_CHAINED = (
    "SELECT item_id, idempotency_key, not_before, send_window, send_tz FROM items "
    "WHERE run_id = %(run_id)s ORDER BY seq"
)
# m004's counters: moves are counted by trigger, a plan's inserts here (once, not per row).
COUNT_PLANNED = (
    "INSERT INTO run_counts (run_id, state, n) VALUES (%(run_id)s, 'pending', %(n)s) "
    "ON CONFLICT (run_id, state) DO UPDATE SET n = run_counts.n + excluded.n"
)


def staged_digests(stage: str) -> str:
    """The intent digests left in the plan's stage table `stage`, in seq order."""
    return f"SELECT intent_digest FROM {stage} ORDER BY seq"


def copy_stage(stage: str, pending_columns: str, item_columns: str) -> str:
    """A plan's staged intents (stage.py's columns) as pending items of `%(run_id)s`, the
    database copying the rows itself."""
    return (
        f"INSERT INTO items ({pending_columns}) SELECT %(run_id)s, {item_columns}, %(at)s, "
        f"'pending', 0 FROM {stage} ORDER BY seq"
    )
