"""Items waiting for their start time or send window (issue 23; schema_sqlite.M009): the
statements the claim, the runner's wake-up and `status` use, the same on both engines.

An item's `not_before` is the earliest instant it may be sent. The claim takes only items
whose `not_before` has passed; one with a window whose clock has moved out of it again (a
range ended, or a paused run resumed late) gets the window's next opening as its new
`not_before` in the claim's own transaction, and is not claimed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import clock
from ..schedule import reopen

# The claim's extra condition; its parameter is the claim's time.
DUE = "(not_before IS NULL OR not_before <= ?)"


def keep_open(conn: Any, run_id: str, rows: Sequence[Any], at: str) -> list[Any]:
    """The rows (read by a claim, pending) whose window is open at `at`; every other one
    gets its window's next opening as its not_before (pending stays pending: no state
    moves, as a backoff's next_attempt_at does not)."""
    moment = clock.parse(at)
    kept = []
    for row in rows:
        spec, tz = row.send_window, row.send_tz
        later = reopen(spec, tz or "UTC", moment) if spec else None
        if later is None:
            kept.append(row)
            continue
        conn.execute(
            "UPDATE items SET not_before = ? WHERE run_id = ? AND seq = ? AND state = 'pending'",
            (later, run_id, row.seq),
        )
    return kept


def next_opening(conn: Any, run_id: str, channel: str, at: str) -> str | None:
    """The earliest not_before still ahead of `at` among the channel's pending items (an
    index probe: items_not_before), or None."""
    (found,) = conn.execute(
        "SELECT MIN(not_before) FROM items WHERE run_id = ? AND channel = ? "
        "AND state = 'pending' AND not_before IS NOT NULL AND not_before > ?",
        (run_id, channel, at),
    ).fetchone()
    return str(found) if found else None


@dataclass(frozen=True)
class Waiting:
    """Pending items whose start time or window is still ahead, and when the first opens."""

    count: int
    next_at: str | None


def waiting(conn: Any, run_id: str, at: str) -> Waiting:
    """How many pending items may not be sent yet at `at`, and the earliest of their times."""
    count, first = conn.execute(
        "SELECT COUNT(*), MIN(not_before) FROM items WHERE run_id = ? AND state = 'pending' "
        "AND not_before IS NOT NULL AND not_before > ?",
        (run_id, at),
    ).fetchone()
    return Waiting(int(count), str(first) if first else None)
