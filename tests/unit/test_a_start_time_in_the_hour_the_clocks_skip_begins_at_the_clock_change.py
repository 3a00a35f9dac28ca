"""A start time written on a wall clock (`--not-before` without a zone, a row's `not_before`
cell without one) that the clocks skip that night is kept as a window's start is kept: it
begins when the clock jumps past it, at the change, never a whole offset later (read with
the offset from before the change, `02:30` on a night New York skips 02:00-03:00 was
03:30 EDT, half an hour after the clock passed 02:30; `02:59`, 03:59). A repeated time is its
first reading. Pure rules (content/schedule.py over domain/windows.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from notifier.content.batch_csv import BatchRow, Problems
from notifier.content.schedule import from_options, parse_moment, schedule_stream
from notifier.domain.windows import next_open, parse_window, zone

# (wall time, zone, the instant it begins): clocks forward in New York (2027-03-14 02:00 EST
# → 03:00 EDT, 07:00 UTC), Paris (2026-03-29 02:00 CET → 03:00 CEST, 01:00 UTC), and Lord
# Howe's half-hour (2026-10-04 02:00 → 02:30, 15:30 UTC the day before); repeated hours in
# New York (2027-11-07 01:00-02:00 twice) and Paris (2026-10-25 02:00-03:00 twice).
CASES = [
    ("2027-03-14T02:00:00", "America/New_York", datetime(2027, 3, 14, 7, tzinfo=UTC)),
    ("2027-03-14T02:30:00", "America/New_York", datetime(2027, 3, 14, 7, tzinfo=UTC)),
    ("2027-03-14T02:59:59", "America/New_York", datetime(2027, 3, 14, 7, tzinfo=UTC)),
    ("2027-03-14T03:00:00", "America/New_York", datetime(2027, 3, 14, 7, tzinfo=UTC)),
    ("2027-03-14T01:59:00", "America/New_York", datetime(2027, 3, 14, 6, 59, tzinfo=UTC)),
    ("2026-03-29T02:30:00", "Europe/Paris", datetime(2026, 3, 29, 1, tzinfo=UTC)),
    ("2026-10-04T02:15:00", "Australia/Lord_Howe", datetime(2026, 10, 3, 15, 30, tzinfo=UTC)),
    ("2027-11-07T01:30:00", "America/New_York", datetime(2027, 11, 7, 5, 30, tzinfo=UTC)),
    ("2026-10-25T02:30:00", "Europe/Paris", datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("wall", "name", "begins"), CASES)
def test_a_start_time_in_the_hour_the_clocks_skip_begins_at_the_clock_change(
    wall: str, name: str, begins: datetime
) -> None:
    assert parse_moment(wall, name).astimezone(UTC) == begins


@pytest.mark.timeout(30)
def test_a_start_time_and_a_window_starting_at_the_same_skipped_time_begin_together() -> None:
    """`--not-before 2027-03-14T02:30` and a window `Sun 02:30-04:00`, both on New York's
    wall clock, begin at one instant: the change, 07:00 UTC, for the option and for a row's
    own `not_before` cell."""
    new_york = zone("America/New_York")
    window = next_open(parse_window("Sun 02:30-04:00"), new_york, datetime(2027, 3, 13, tzinfo=UTC))
    assert window == datetime(2027, 3, 14, 7, tzinfo=UTC)
    rows = [
        BatchRow(line=2, seq=1, item_id="1", to="a@example.com", subject="s", body="b",
                 channel="outbox", data={"tz": "America/New_York", "not_before": ""}),
        BatchRow(line=3, seq=2, item_id="2", to="b@example.com", subject="s", body="b",
                 channel="outbox",
                 data={"tz": "America/New_York", "not_before": "2027-03-14T02:30:00"}),
    ]  # fmt: skip
    schedule = from_options("2027-03-14T02:30:00", "America/New_York", None, {})
    schedule.now = datetime(2027, 3, 13, tzinfo=UTC)
    problems = Problems()
    starts = [row.not_before for row in schedule_stream(rows, schedule, problems)]
    assert not problems
    assert starts == ["2027-03-14T07:00:00.000000+00:00"] * 2
