"""Send windows: when, on the recipient's wall clock, an item may be sent.

A window is one or more ranges, comma-separated: `Mon-Fri 09:00-18:00, Sat 10:00-14:00`.
Each range is a day or a run of days (`Mon`, `Mon-Fri`, `Fri-Mon` wraps past Sunday) and a
time range `HH:MM[-:SS]-HH:MM[:SS]` on the wall clock of a time zone (IANA name, zoneinfo).

- A range whose end is not after its start crosses midnight: `Fri 22:00-02:00` opens Friday
  at 22:00 and closes Saturday at 02:00; its days are the days it opens on. `24:00` is the
  end of a day, so `Mon 00:00-24:00` is the whole of Monday. Equal start and end is refused
  (empty, or a whole day? the operator says which).
- Open means the wall clock reads a time inside a range, so a range is as long as the clock
  says: on the night the clocks go forward a range that starts in the skipped hour opens when
  the clock jumps past its start; on the night they go back a range may be open twice over
  the repeated hour (it reads the same wall time twice).

Pure functions of their arguments: no clock is read here, so tests give `now`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from notifier.domain import clock

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_S = 86_400
# How many days ahead an opening is looked for: a week, plus one more for a range skipped by a
# clock change, plus slack; every valid window opens within it.
_HORIZON_DAYS = 16
_RANGE = re.compile(
    r"^\s*(?P<d1>[A-Za-z]{3})(?:\s*-\s*(?P<d2>[A-Za-z]{3}))?\s+"
    r"(?P<t1>\d{1,2}:\d{2}(?::\d{2})?)\s*-\s*(?P<t2>\d{1,2}:\d{2}(?::\d{2})?)\s*$"
)
EXAMPLE = '"Mon-Fri 09:00-18:00, Sat 10:00-14:00"'


@dataclass(frozen=True)
class Range:
    """One range: the weekdays it opens on (0 = Monday), and its start and end in seconds
    after midnight; end <= start means it ends the next day."""

    days: frozenset[int]
    start: int
    end: int

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start


@dataclass(frozen=True)
class Window:
    spec: str  # as the operator wrote it (stored per item, parsed again at each claim)
    ranges: tuple[Range, ...]


@lru_cache(maxsize=256)  # parsed again at each claim and before each send of a windowed item
def parse_window(spec: str) -> Window:
    """The window `spec` describes; ValueError saying what is wrong with it."""
    parts = spec.split(",")
    if not spec.strip() or any(not part.strip() for part in parts):
        raise ValueError(f"is empty or has an empty range: write ranges like {EXAMPLE}")
    return Window(spec.strip(), tuple(_range(part) for part in parts))


def _range(text: str) -> Range:
    match = _RANGE.match(text)
    if match is None:
        raise ValueError(f"range {text.strip()!r} is not `DAY[-DAY] HH:MM-HH:MM`, e.g. {EXAMPLE}")
    first = _day(match["d1"])
    last = _day(match["d2"]) if match["d2"] else first
    days = frozenset((first + n) % 7 for n in range((last - first) % 7 + 1))
    start, end = _time(match["t1"], text), _time(match["t2"], text)
    if start == DAY_S:
        raise ValueError(f"range {text.strip()!r} starts at 24:00: start it at 00:00")
    if start == end:
        raise ValueError(
            f"range {text.strip()!r} starts and ends at the same time: for a whole day "
            "write 00:00-24:00"
        )
    return Range(days, start, end)


def _day(text: str) -> int:
    try:
        return DAYS.index(text.lower())
    except ValueError:
        raise ValueError(f"{text!r} is not a day: use {', '.join(DAYS)}") from None


def _time(text: str, context: str) -> int:
    hours, minutes, *rest = (int(n) for n in text.split(":"))
    seconds = rest[0] if rest else 0
    total = hours * 3600 + minutes * 60 + seconds
    if minutes > 59 or seconds > 59 or total > DAY_S:
        raise ValueError(f"{text!r} in {context.strip()!r} is not a time between 00:00 and 24:00")
    return total


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ValueError saying it is not one."""
    try:
        if not name.strip() or name != name.strip():
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a region of the database (`Europe`: IsADirectoryError), or a file that
        # cannot be read as a zone.
        raise ValueError(
            f"{name!r} is not an IANA time zone name: use one like Europe/Paris, "
            "America/New_York or UTC"
        ) from None


def is_open(window: Window, tz: tzinfo, now: datetime) -> bool:
    """Whether the wall clock of `tz` at the instant `now` (aware) reads a time inside one of
    the window's ranges."""
    local = now.astimezone(tz)
    seconds = local.hour * 3600 + local.minute * 60 + local.second
    day = local.weekday()
    for r in window.ranges:
        if r.crosses_midnight:
            if (day in r.days and seconds >= r.start) or (
                (day - 1) % 7 in r.days and seconds < r.end
            ):
                return True
        elif day in r.days and r.start <= seconds < r.end:
            return True
    return False


def next_open(window: Window, tz: tzinfo, now: datetime) -> datetime:
    """The first instant at or after `now` at which the window is open (UTC); `now` itself
    when it is open. A range opens when the wall clock first reads its start: at the instant
    of that wall time, or, when a clock change skips it, at the change; and again at a
    change that sets the clock back to a time inside it."""
    if is_open(window, tz, now):
        return now.astimezone(UTC)
    local_day = now.astimezone(tz).date()
    best: datetime | None = None
    for offset in range(-1, _HORIZON_DAYS):
        day = local_day + timedelta(days=offset)
        # A range opens when the clock first reads its start, or, mid-range, when the clock
        # going back carries it into the range again (it reads a repeated time inside it).
        moments = _changes_around(day, tz)
        for r in window.ranges:
            if day.weekday() in r.days:
                moments += _openings(day, r.start, tz)
        for moment in moments:
            if moment >= now and (best is None or moment < best) and is_open(window, tz, moment):
                best = moment
        if best is not None and best.astimezone(tz).date() <= day:
            break  # a later day's openings are later still
    if best is None:  # every range of a valid window opens within a week or two
        raise ValueError(f"window {window.spec!r} never opens")
    return best.astimezone(UTC)


def first_reading(naive: datetime, tz: tzinfo) -> datetime:
    """The first instant (UTC) at which the wall clock of `tz` reads `naive`: the first of
    a repeated time, or, when a clock change skips it, the change, as a range starting
    then opens (a start time on a wall clock: `--not-before` or a `not_before` cell without
    a zone)."""
    return min(_readings(naive, tz))


def _openings(day: date, start: int, tz: tzinfo) -> list[datetime]:
    """The instants at which the wall clock of `tz` first reads `start` on `day`: both
    readings of a repeated time, or the clock change that skips it."""
    return _readings(datetime(day.year, day.month, day.day) + timedelta(seconds=start), tz)


def _readings(naive: datetime, tz: tzinfo) -> list[datetime]:
    """The instants (UTC) at which the wall clock of `tz` reads `naive`: both readings of a
    repeated time, or the clock change that skips it."""
    found = []
    for fold in (0, 1):
        local = naive.replace(tzinfo=tz, fold=fold)
        instant = local.astimezone(UTC)
        if instant.astimezone(tz).replace(tzinfo=None) == naive:
            found.append(instant)
    if not found:  # skipped: the clock jumps from before `start` to after it
        found.append(_change_between(naive, tz))
    return found


def _changes_around(day: date, tz: tzinfo) -> list[datetime]:
    """The instant of the clock change around the local `day`, if any (from three hours
    before its midnight to three hours after the next, so that a change is found on the day
    it falls on whatever its hour): where the offset before it ends, bisected to the second."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=tz)
    low = int(midnight.timestamp()) - 3 * 3600
    high = low + 30 * 3600
    if datetime.fromtimestamp(high, tz).utcoffset() == datetime.fromtimestamp(low, tz).utcoffset():
        return []
    return [_change_in(low, high, tz)]


def _change_between(naive: datetime, tz: tzinfo) -> datetime:
    """The instant of the clock change that skips the wall time `naive`: the offset before
    it (fold 0) and after it (fold 1) bracket the change; bisected to the second."""
    a = int(naive.replace(tzinfo=tz, fold=1).timestamp())
    b = int(naive.replace(tzinfo=tz, fold=0).timestamp())
    return _change_in(min(a, b), max(a, b), tz)


def _change_in(low: int, high: int, tz: tzinfo) -> datetime:
    """The instant (UTC) of the one clock change between the Unix seconds `low` and `high`,
    whose offsets differ: bisected to the second."""
    before = datetime.fromtimestamp(low, tz).utcoffset()
    while high - low > 1:  # offset `before` at low, the new one at high: whole seconds
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == before:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


def earliest(
    not_before: datetime | None, window: Window | None, tz: tzinfo, now: datetime
) -> datetime:
    """When an item planned at `now` may first be sent: not before `not_before`, and inside
    its window."""
    start = max(now, not_before) if not_before is not None else now
    return next_open(window, tz, start) if window is not None else start.astimezone(UTC)


def reopen(spec: str, tz_name: str, now: datetime) -> str | None:
    """For a claim: None when the item's window is open at `now`, else the next opening (UTC
    ISO), to store as its not_before."""
    window, tz = parse_window(spec), zone(tz_name)
    if is_open(window, tz, now):
        return None
    return clock.iso(next_open(window, tz, now))
