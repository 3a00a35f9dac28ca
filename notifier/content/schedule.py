"""When each row of a batch may be sent, worked out at plan time.

A row's earliest send time is the latest of `send --not-before` (without a zone: on the
wall clock of the row's `tz`, else `send --tz`), its own `not_before` column
and the moment it is planned, moved on to the next opening of its window: `send --window`,
else its channel's `window` option, on the wall clock of its `tz` column, else `send --tz`,
else UTC. The item stores that instant (`not_before`) and the window and zone it came from,
so a claim that finds the window closed again computes the next opening (ledger).

None of this is part of the intent or its digest: it says when a row goes out, not what goes
out. A changed start time or window is not a changed row for `--resend-changed`, and an
approval covers what is sent, not when. (The deadline, `not_after`, is digested: it decides
whether a row is sent at all.) The event chain covers them instead (intent.Schedules), so
that `verify` finds one rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from notifier.content.batch_csv import BatchError, BatchRow, Problem, Problems
from notifier.domain import clock
from notifier.domain.errors import BadInput, NextStep
from notifier.domain.records import Item
from notifier.domain.windows import Window, earliest, first_reading, parse_window, reopen, zone

# The CSV columns read here (case-insensitively), taken out of a row's data columns so that
# they never reach the payload or its digest.
COLUMNS = ("not_before", "tz")
DATETIME_EXAMPLE = "2026-12-01T09:00:00+01:00 (or 2026-12-01T09:00:00 in the row's tz)"


@dataclass
class Schedule:
    """The run's options for when rows go out, and the rows found unable to go out in time."""

    not_before: datetime | None = None  # send --not-before, in --tz when it has no zone
    tz: str = "UTC"  # send --tz: the zone of rows without a `tz` column
    window: Window | None = None  # send --window, over every channel's own
    channel_windows: Mapping[str, Window] = field(default_factory=dict)
    # --not-before as written when it names no zone: read in each row's own zone.
    not_before_local: str | None = None
    now: datetime = field(default_factory=lambda: clock.now())  # noqa: PLW0108 (a test replaces clock.now)
    late: list[int] = field(default_factory=list)  # lines whose window opens after not_after

    @property
    def idle(self) -> bool:
        """Nothing to schedule: every row goes out as soon as its turn comes."""
        return self.not_before is None and self.window is None and not self.channel_windows

    def window_of(self, channel: str) -> Window | None:
        return self.window or self.channel_windows.get(channel)


def from_options(
    not_before: str | None,
    tz: str | None,
    window: str | None,
    channels: Mapping[str, Mapping[str, Any]],
) -> Schedule:
    """The send options as a Schedule; BadInput naming the option that is wrong."""
    zone_name = "UTC"
    if tz is not None:
        try:
            zone(tz)
        except ValueError as exc:
            raise BadInput(f"--tz {exc}").advise(NextStep.EXAMPLE_TZ) from None
        zone_name = tz
    start = None
    local = None
    if not_before is not None:
        try:
            start = parse_moment(not_before, zone_name)
        except ValueError as exc:
            raise BadInput(
                f"--not-before {exc}: use ISO 8601, e.g. --not-before {DATETIME_EXAMPLE}."
            ) from None
        if datetime.fromisoformat(not_before.strip()).tzinfo is None:
            local = not_before
    run_window = None
    if window is not None:
        try:
            run_window = parse_window(window)
        except ValueError as exc:
            raise BadInput(f"--window {exc}").advise(NextStep.EXAMPLE_WINDOW) from None
    # Channel windows were validated with the configuration (channels/options.WINDOW).
    own = {name: parse_window(str(d["window"])) for name, d in channels.items() if d.get("window")}
    return Schedule(start, zone_name, run_window, own, not_before_local=local)


def parse_moment(text: str, tz_name: str) -> datetime:
    """ISO 8601 with an offset, or without one on the wall clock of the zone `tz_name` (the
    first instant it reads that time: windows.first_reading); ValueError otherwise."""
    value = datetime.fromisoformat(text.strip())
    if value.tzinfo is None:
        value = _first_reading(value, zone(tz_name), text)
    return clock.in_range(value, text)


def _first_reading(naive: datetime, tz: ZoneInfo, text: str) -> datetime:
    """windows.first_reading; a time so far out that the zone carries it past the dates
    Python holds is out of range, as clock.in_range says of any other."""
    try:
        return first_reading(naive, tz)
    except (OverflowError, ValueError, OSError):
        return clock.in_range(naive.replace(tzinfo=tz), text)


def schedule_stream(
    rows: Iterable[BatchRow], schedule: Schedule, problems: Problems
) -> Iterator[BatchRow]:
    """Each row with its schedule columns taken out of its data and its earliest send time
    set; a row whose `not_before` or `tz` is bad is noted in `problems` and left out."""
    stream = iter(rows)
    for row in stream:
        picked = {n: v for n, v in row.data.items() if n.casefold() in COLUMNS}
        if not picked and schedule.idle:
            # Every row has the header's columns: nothing to do for this one, nor the rest
            # (a million-row plan pays nothing per row for a feature it does not use).
            yield row
            yield from stream
            return
        cells = {n.casefold(): v.strip() for n, v in picked.items()}
        data = {n: v for n, v in row.data.items() if n not in picked}
        tz_name = cells.get("tz") or schedule.tz
        try:
            zone(tz_name)
        except ValueError as exc:
            problems.append(Problem(row.line, f"`tz` {exc}"))
            continue
        start = schedule.not_before
        if schedule.not_before_local is not None and tz_name != schedule.tz:
            # A --not-before without a zone is a wall-clock time in each row's own zone.
            try:
                start = parse_moment(schedule.not_before_local, tz_name)
            except ValueError as exc:  # out of range once read in this row's zone
                problems.append(
                    Problem(row.line, f"--not-before {exc} on the wall clock of `tz` {tz_name}")
                )
                continue
        if cells.get("not_before"):
            try:
                own = parse_moment(cells["not_before"], tz_name)
            except ValueError as exc:
                problems.append(
                    Problem(row.line, f"`not_before` {exc}: use ISO 8601, e.g. {DATETIME_EXAMPLE}")
                )
                continue
            start = own if start is None else max(start, own)
        window = schedule.window_of(row.channel)
        when = _earliest(
            clock.iso(start) if start is not None else None,
            window.spec if window is not None else None,
            tz_name,
            clock.iso(schedule.now),
        )
        if row.not_after is not None and when >= row.not_after:
            schedule.late.append(row.line)
        yield row._replace(
            data=data,
            not_before=when,
            send_window=window.spec if window is not None else None,
            send_tz=tz_name if window is not None else None,
        )


def scheduled(rows: Sequence[BatchRow], schedule: Schedule, path: Path) -> list[BatchRow]:
    """`rows` (a `send --compose` file, read whole) through schedule_stream, before a token
    is spent on them: BatchError naming every row whose `not_before` or `tz` is bad."""
    problems = Problems()
    kept = list(schedule_stream(rows, schedule, problems))
    if problems:
        raise BatchError(path, problems)
    return kept


def retime(row: BatchRow, now: datetime) -> BatchRow:
    """A row scheduled earlier (a composed row, read before drafting) as schedule_stream
    would schedule it at `now` (when its intent is frozen): its start time was the next
    opening at or after the latest of its own start and the earlier `now`, so moving it on
    from `now` gives the next opening at or after the later of its start and `now`."""
    if row.not_before is None:
        return row  # nothing was scheduled: it goes as soon as its turn comes
    when = _earliest(row.not_before, row.send_window, row.send_tz or "UTC", clock.iso(now))
    return row._replace(not_before=when)


@lru_cache(maxsize=4096)
def _earliest(start: str | None, spec: str | None, tz_name: str, now: str) -> str:
    """windows.earliest over text, cached: the rows of a batch mostly share all four."""
    window = parse_window(spec) if spec is not None else None
    moment = earliest(
        clock.parse(start) if start else None, window, zone(tz_name), clock.parse(now)
    )
    return clock.iso(moment.astimezone(UTC))


def late_warning(schedule: Schedule) -> str | None:
    """The planning warning for rows whose window opens only after their not_after."""
    if not schedule.late:
        return None
    shown = ", ".join(str(n) for n in schedule.late[:20])
    more = f" and {len(schedule.late) - 20} more" if len(schedule.late) > 20 else ""
    return (
        f"warning: {len(schedule.late)} row(s) cannot be sent before their not_after (their "
        f"window or not_before opens later): line(s) {shown}{more}. They will be expired "
        "unless the window opens in time; widen --window or move not_after."
    )


def closed(item: Item) -> str | None:
    """Why `item` may not start now, checked right before its send: an item claimed ahead
    may wait for a free sender past its window's end. Released, never attempted, it is given
    the next opening by the next claim (store/waiting.py)."""
    if item.send_window and reopen(item.send_window, item.send_tz or "UTC", clock.now()):
        return f"its send window ({item.send_window}, {item.send_tz}) closed before it started"
    return None


class _Waiting(Protocol):
    @property
    def count(self) -> int: ...

    @property
    def next_at(self) -> str | None: ...


class _Waits(Protocol):
    """What pause_cause reads of the store (its queries, Store.queries), typed so that this
    module need not import the store."""

    def waiting(self, run_id: str) -> _Waiting: ...


def pause_cause(queries: _Waits, run_id: str, until: datetime) -> str:
    """What a run that pauses rather than wait past --max-wait, `until` then, says it waits
    for: items' start times or windows only when the first of them comes by then (within a
    second: `until` was worked out on the monotonic clock), else the downstream (a
    Retry-After, a throttle's gate)."""
    waiting = queries.waiting(run_id)
    first = waiting.next_at
    if waiting.count and first and clock.parse(first) <= until + timedelta(seconds=1):
        return f"{waiting.count} item(s) wait for their start time or send window"
    return "the downstream asked to wait"
