"""When the committer may next start something, on the monotonic clock: the items held by a
backoff given in this process, and the moment the next pending item, or the next status
query of an item waiting for its query_delay, may start. Either waits for its channel's
gate: a throttled answer (to a send or to a query) holds both sends and queries back."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from notifier.domain import clock
from notifier.engine.pipeline import POLL_S

if TYPE_CHECKING:
    from notifier.engine.judging import Progress
    from notifier.store.queries import Queries


def held(p: Progress) -> list[int]:
    """Items still waiting out a backoff given in this process (expired holds dropped)."""
    now = time.monotonic()
    p.holds = {seq: until for seq, until in p.holds.items() if until > now}
    return list(p.holds)


def next_wake(queries: Queries, run_id: str, p: Progress) -> float | None:
    """The monotonic time when the next pending item may start (its own next_attempt_at), or
    the next query of an item waiting for its query_delay, each no earlier than its
    channel's gate; an item no earlier than its in-process hold. None when nothing is
    pending or waiting to be asked."""
    now = time.monotonic()
    wakes = []
    for channel, earliest in queries.pending_by_channel(run_id):
        # A stored time is wall-clock (from an earlier process or this one): converted.
        wake = now + (clock.seconds_until(clock.parse(earliest)) if earliest else 0.0)
        wakes.append(max(wake, p.gates.get(channel, wake)))
    # An item waiting for its query_delay keeps the run open until it is asked again.
    for item in queries.waiting_for_query(run_id):
        if item.next_attempt_at is not None:
            wake = now + clock.seconds_until(clock.parse(item.next_attempt_at))
            wakes.append(max(wake, p.gates.get(item.channel, wake)))
    if not wakes:
        return None
    if min(wakes) <= now:
        # Something looks due by the wall clock, yet nothing could be claimed: those items
        # are held by a backoff given in this process (the wall clock may have jumped).
        later = [w for w in wakes if w > now] + [h for h in p.holds.values() if h > now]
        return min(later, default=now)
    return min(wakes)


def next_deadline(queries: Queries, run_id: str) -> float | None:
    """The monotonic time when the next pending item's `not_after` passes (it is then
    expired, whatever it waits for: a start time, a window, a backoff), or None. Not held by
    any gate: expiring an item sends nothing."""
    deadline = queries.next_deadline(run_id)
    if deadline is None:
        return None
    return time.monotonic() + clock.seconds_until(clock.parse(deadline))


def poll_timeout(p: Progress) -> float:
    """How long the committer waits for a finished send: until a gate or hold may open, at
    most POLL_S (so a cancel or Ctrl-C is seen soon)."""
    now = time.monotonic()
    gates = p.closed_gates(now).values()
    opens = [t for t in (*gates, *p.holds.values()) if t > now]
    return max(0.001, min([POLL_S, *(t - now for t in opens)]))
