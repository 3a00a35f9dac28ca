"""The statements of store/core.py (their notation: statements/__init__.py)."""

from __future__ import annotations

import functools

from notifier.domain.state_machine import ItemState
from notifier.store.statements import KEPT, state_literal

# The fences (core.Core._fence_query): the version the writer's lease must still hold, its
# one parameter the lease's key. A worker's own lease is read shared, held to COMMIT: a
# reap of that worker waits for the commit, or the commit sees the reap.
WORKER_LEASE_FENCE = (
    "SELECT version FROM workers WHERE worker_id = %(key)s AND state = 'live' {share_lock}"
)
# The run's own lease is exclusive: its transactions take the run's row for good.
RUN_LEASE_FENCE = "SELECT lease_version FROM runs WHERE run_id = %(key)s {row_lock}"
# The same versions read without a lock (core.Core._fence_moved: after a failed write, on
# a connection of its own, which must not wait for the rows that write may have waited for).
WORKER_LEASE_VERSION = "SELECT version FROM workers WHERE worker_id = %(key)s AND state = 'live'"
RUN_LEASE_VERSION = "SELECT lease_version FROM runs WHERE run_id = %(key)s"
RUNS = "SELECT * FROM runs ORDER BY created_at DESC, rowid DESC"
RUN = "SELECT * FROM runs WHERE run_id = %(run_id)s"
# Read to be written in this transaction: the row is held to COMMIT.
LOCKED_RUN = "SELECT * FROM runs WHERE run_id = %(run_id)s {row_lock}"
RUNS_WITH_CONTENT_FINGERPRINT = (
    "SELECT * FROM runs WHERE content_fingerprint = %(content_fingerprint)s "
    "ORDER BY created_at DESC, rowid DESC"
)

# The shapes below are cached: a move's columns are fixed by its caller, so they are few, and
# the same text each time is one dict probe for the engine's compiled statements.


@functools.lru_cache(maxsize=KEPT)
def move_item(current: ItemState, columns: tuple[str, ...]) -> str:
    """An item's conditional move from `current` (a literal: see state_literal) to
    `%(target)s`, setting `columns` too, each bound by its own name."""
    sets = "".join(f", {column} = %({column})s" for column in columns)
    return (
        f"UPDATE items SET state = %(target)s, updated_at = %(at)s{sets} "
        f"WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = {state_literal(current)}"
    )


@functools.lru_cache(maxsize=KEPT)
def move_run(columns: tuple[str, ...]) -> str:
    """A run's conditional move from `%(current)s` to `%(target)s`, setting `columns` too."""
    sets = "".join(f", {column} = %({column})s" for column in columns)
    return (
        f"UPDATE runs SET state = %(target)s, updated_at = %(at)s{sets} "
        "WHERE run_id = %(run_id)s AND state = %(current)s"
    )


@functools.lru_cache(maxsize=KEPT)
def insert_row(table: str, columns: tuple[str, ...]) -> str:
    """One row of `table`, each of `columns` bound by its own name."""
    values = ", ".join(f"%({column})s" for column in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values})"
