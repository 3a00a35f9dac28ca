"""Timestamps as fixed-width ISO-8601 UTC text, so that SQL string comparison orders them.

The test switch for the wall clock (as waits.py is for waits): NOTIFIER_TEST_CLOCK_SHIFT_S
moves this process's `now` that many seconds on, so a test can run `resume` after a
deadline it froze into a plan without sleeping until that deadline, however long the plan
took on a loaded machine. Read once, at import: every command is a process of its own. Unset
(production), the shift is 0 and nothing changes."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

SHIFT_ENV = "NOTIFIER_TEST_CLOCK_SHIFT_S"
_SHIFT = timedelta(seconds=float(os.environ.get(SHIFT_ENV) or 0))


def now() -> datetime:
    return datetime.now(UTC) + _SHIFT


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def now_iso() -> str:
    return iso(now())


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


# The moments an operator may give (--not-before, --not-after, a row's not_before or
# not_after): past either end, applying a zone or finding a window's next opening would step
# outside the dates Python holds, after the run was stored. A start time is worked on (the
# next opening of a window, a wait until it); a deadline is only compared, so it may be as
# late as a date goes: 9999-12-31, the "never expires" of spreadsheets and databases.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
LAST = datetime.max.replace(tzinfo=UTC)


def in_range(moment: datetime, text: str, latest: datetime = LATEST) -> datetime:
    """`moment` (aware), as read from `text`; ValueError when it is before EARLIEST, or not
    before `latest` (LAST: a moment that has a UTC time at all)."""
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc < latest:
        raise ValueError(
            f"{text.strip()!r} is out of range (from {EARLIEST:%Y-%m-%d} to {latest:%Y-%m-%d} UTC)"
        )
    return moment


def later(seconds: float, start: datetime | None = None) -> datetime:
    return (start or now()) + timedelta(seconds=seconds)


def local(text: str | None) -> str:
    """A stored timestamp as the operator's local wall-clock time, for messages, rounded up
    to the whole second: a wait that ends at 03:59:59.9998 (worked out on another clock) is
    said to end at 04:00:00, never a second before the window it waits for opens."""
    if not text:
        return "-"
    moment = parse(text)
    try:
        if moment.microsecond:
            moment += timedelta(microseconds=1_000_000 - moment.microsecond)
        return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except OverflowError:  # a deadline of 9999-12-31 has no later local time: shown in UTC
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds_until(moment: datetime) -> float:
    """Seconds from now (wall clock) to `moment`; 0 when it has passed."""
    return max(0.0, (moment - now()).total_seconds())
