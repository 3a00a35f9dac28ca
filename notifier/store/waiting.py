"""Items waiting for their start time or send window (schema_sqlite.M009): the
reads and writes the claim, the runner's wake-up and `status` use (their statements in
statements; the claim's condition is their DUE), the same on both engines.

An item's `not_before` is the earliest instant it may be sent. The claim takes only items
whose `not_before` has passed; one with a window whose clock has moved out of it again (a
range ended, or a paused run resumed late) gets the window's next opening as its new
`not_before` in the claim's own transaction, and is not claimed. That move is chained (a
`reopened` event with the start time it found and the one it wrote), as every other write
of an item is: verify replays it, and names a start time nothing recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from notifier.domain import clock
from notifier.domain.records import EventKind
from notifier.domain.windows import reopen
from notifier.store.backend import Engine
from notifier.store.core import Core
from notifier.store.statements import waiting as sql


def keep_open(core: Core, run_id: str, rows: Sequence[Any], at: str) -> list[Any]:
    """The rows (read by a claim, pending) whose window is open at `at`; every other one
    gets its window's next opening as its not_before (pending stays pending: no state
    moves, as a backoff's next_attempt_at does not), and a `reopened` event saying so."""
    moment = clock.parse(at)
    kept = []
    moved: dict[int, dict[str, Any]] = {}
    for row in rows:
        spec, tz = row.send_window, row.send_tz
        later = reopen(spec, tz or "UTC", moment) if spec else None
        if later is None:
            kept.append(row)
            continue
        key = {"not_before": later, "run_id": run_id, "seq": row.seq}
        if core.engine.execute(sql.REOPEN, key).rowcount == 1:
            moved[row.seq] = {"from": row.not_before, "to": later}
    if moved:
        core.each_event(run_id, EventKind.REOPENED, moved, at)
    return kept


def next_opening(engine: Engine, run_id: str, channel: str, at: str) -> str | None:
    """The earliest not_before still ahead of `at` among the channel's pending items (an
    index probe: items_not_before), or None."""
    (found,) = engine.execute(
        sql.NEXT_OPENING, {"run_id": run_id, "channel": channel, "at": at}
    ).fetchone()
    return str(found) if found else None


@dataclass(frozen=True)
class Waiting:
    """Pending items whose start time or window is still ahead, and when the first opens."""

    count: int
    next_at: str | None


def waiting(engine: Engine, run_id: str, at: str) -> Waiting:
    """How many pending items may not be sent yet at `at`, and the earliest of their times:
    those whose start time is ahead, and those whose start time has come but whose window
    is closed at `at` (a run stopped while it was open, looked at after it closed: no claim
    has moved them on yet), with its next opening. An item past its not_after waits for
    nothing: it is expired, never sent, when the run next goes on."""
    key = {"run_id": run_id, "at": at}
    count, first = engine.execute(sql.WAITING, key).fetchone()
    total, times = int(count), [str(first)] if first else []
    moment = clock.parse(at)
    for spec, tz, n in engine.execute(sql.WINDOWS_DUE, key).fetchall():
        later = reopen(str(spec), str(tz or "UTC"), moment)
        if later is not None:
            total += int(n)
            times.append(later)
    return Waiting(total, min(times, default=None))
