"""On the night the clocks go back, a range whose end falls in the repeated hour is open
again once the clock reads inside it a second time (windows.py: open means the wall clock
reads a time inside a range). That second opening is the window's next opening: a claim
that finds the window closed in between gives its items that moment, never next week's
(which could lie past their deadline). Pure functions, so instants are given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from notifier.domain import clock
from notifier.domain.windows import is_open, next_open, parse_window, reopen


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("spec", "name", "closed", "opens"),
    [
        # Berlin, 2026-10-25: 03:00 CEST (01:00 UTC) becomes 02:00 CET again.
        ("Sun 01:30-02:30", "Europe/Berlin", "2026-10-25T00:45", "2026-10-25T01:00"),
        ("Sat 23:30-02:30", "Europe/Berlin", "2026-10-25T00:45", "2026-10-25T01:00"),
        # New York, 2026-11-01: 02:00 EDT (06:00 UTC) becomes 01:00 EST again.
        ("Sun 00:00-01:30", "America/New_York", "2026-11-01T05:45", "2026-11-01T06:00"),
        ("Sat-Sun 22:00-01:15", "America/New_York", "2026-11-01T05:20", "2026-11-01T06:00"),
        # Lord Howe, 2026-04-05: 02:00 (+11) becomes 01:30 (+10:30) again.
        ("Sun 01:00-01:45", "Australia/Lord_Howe", "2026-04-04T14:50", "2026-04-04T15:00"),
    ],
)
def test_the_next_opening_is_the_clock_reading_inside_the_range_again(
    spec: str, name: str, closed: str, opens: str
) -> None:
    """Closed between the range's first end and the clock change, open again from the change:
    next_open from the gap is the change itself, and reopen stores it."""
    window, tz = parse_window(spec), ZoneInfo(name)
    assert not is_open(window, tz, at(closed))
    assert is_open(window, tz, at(opens))
    assert next_open(window, tz, at(closed)) == at(opens)
    assert reopen(spec, name, at(closed)) == clock.iso(at(opens))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
def test_nothing_between_now_and_the_next_opening_is_open(name: str) -> None:
    """Every range of whole quarter hours from 00:00 to 04:00 on the night the clocks go back,
    and every `now` half an hour apart over it: none of the five-minute marks (every range
    and clock change of these zones falls on one) before next_open is open."""
    tz = ZoneInfo(name)
    night = {"Europe/Berlin": "2026-10-24T22:00", "America/New_York": "2026-11-01T03:00",
             "Australia/Lord_Howe": "2026-04-04T12:00"}[name]  # fmt: skip
    day = "Sun"
    quarters = [f"{q // 4:02d}:{q % 4 * 15:02d}" for q in range(0, 17)]
    for i, start in enumerate(quarters):
        for end in quarters[i + 1 :]:
            window = parse_window(f"{day} {start}-{end}")
            for step in range(0, 6 * 2):
                now = at(night) + timedelta(minutes=30 * step)
                opened = next_open(window, tz, now)
                moment = now
                while moment < min(opened, now + timedelta(hours=4)):
                    assert not is_open(window, tz, moment), (start, end, now, opened, moment)
                    moment += timedelta(minutes=5)
