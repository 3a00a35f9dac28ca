"""Send windows (notifier/domain/windows.py): parsing, and next_open/is_open as properties over
time zones with clock changes, instants drawn around those changes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.content.batch_csv import BatchRow, Problems
from notifier.content.schedule import from_options, schedule_stream
from notifier.domain import clock
from notifier.domain.windows import DAYS, is_open, next_open, parse_window, zone

ZONES = [
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute clock change
    "America/Sao_Paulo",
    "Pacific/Apia",  # skipped a whole day (2011-12-30)
]
# Instants near clock changes, and anywhere.
CHANGES = [
    datetime(2026, 3, 29, 1, tzinfo=UTC),  # Europe forward
    datetime(2026, 10, 25, 1, tzinfo=UTC),  # Europe back
    datetime(2026, 3, 8, 7, tzinfo=UTC),  # New York forward
    datetime(2026, 11, 1, 6, tzinfo=UTC),  # New York back
    datetime(2026, 4, 4, 15, tzinfo=UTC),  # Lord Howe back
    datetime(2011, 12, 30, 10, tzinfo=UTC),  # Apia skips a day
]


@st.composite
def ranges(draw: st.DrawFn) -> str:
    first = draw(st.sampled_from(DAYS))
    last = draw(st.one_of(st.none(), st.sampled_from(DAYS)))
    days = first if last is None else f"{first}-{last}"
    # Times on the minute and near the usual clock-change hours, so ranges start, end and
    # cross inside skipped and repeated hours.
    start = draw(st.integers(0, 24 * 60 - 1))
    end = draw(st.integers(1, 24 * 60).filter(lambda e: e != start))
    near = draw(st.booleans())
    if near:
        start = draw(st.integers(60, 4 * 60))
        end = draw(st.integers(start + 1, 4 * 60 + 30))
    return f"{days} {start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


specs = st.lists(ranges(), min_size=1, max_size=3).map(", ".join)
instants = st.one_of(
    st.builds(
        lambda base, s: base + timedelta(seconds=s),
        st.sampled_from(CHANGES),
        st.integers(-3 * 86400, 3 * 86400),
    ),
    st.datetimes(datetime(2000, 1, 1), datetime(2060, 1, 1)).map(lambda d: d.replace(tzinfo=UTC)),
)


@settings(max_examples=300, deadline=None)
@given(specs, st.sampled_from(ZONES), instants, st.floats(0, 1))
def test_next_open_is_the_first_open_instant(
    spec: str, name: str, now: datetime, fraction: float
) -> None:
    """next_open is open, not before now, and nothing between now and it is open."""
    window, tz = parse_window(spec), ZoneInfo(name)
    opened = next_open(window, tz, now)
    assert opened >= now
    assert is_open(window, tz, opened)
    if opened > now:
        assert not is_open(window, tz, now)
        # Any instant in between (drawn), and the last second before the opening.
        between = now + (opened - now) * fraction
        if between < opened:
            assert not is_open(window, tz, between)
        before = opened - timedelta(seconds=1)
        if before >= now:
            assert not is_open(window, tz, before)


@settings(max_examples=200, deadline=None)
@given(specs, st.sampled_from(ZONES), instants)
def test_an_open_window_is_open_now(spec: str, name: str, now: datetime) -> None:
    """When the window is open at now, next_open is now itself."""
    window, tz = parse_window(spec), ZoneInfo(name)
    if is_open(window, tz, now):
        assert next_open(window, tz, now) == now


def test_the_skipped_hour_opens_at_the_clock_change() -> None:
    """A range starting in the hour the clocks skip opens when they jump (Paris, 2026-03-29)."""
    window = parse_window("Sun 02:30-04:00")
    opened = next_open(window, ZoneInfo("Europe/Paris"), datetime(2026, 3, 28, 12, tzinfo=UTC))
    assert opened == datetime(2026, 3, 29, 1, tzinfo=UTC)  # 03:00 CEST


def test_a_range_may_cross_midnight() -> None:
    """`Fri 22:00-02:00` is open late Friday and early Saturday, closed early Friday."""
    window, tz = parse_window("Fri 22:00-02:00"), ZoneInfo("UTC")
    assert is_open(window, tz, datetime(2026, 12, 4, 23, tzinfo=UTC))  # Friday
    assert is_open(window, tz, datetime(2026, 12, 5, 1, tzinfo=UTC))  # Saturday
    assert not is_open(window, tz, datetime(2026, 12, 4, 1, tzinfo=UTC))
    assert next_open(window, tz, datetime(2026, 12, 5, 3, tzinfo=UTC)) == datetime(
        2026, 12, 11, 22, tzinfo=UTC
    )


@pytest.mark.parametrize(
    "spec",
    ["", "Mon", "Mon 09:00", "Xyz 09:00-10:00", "Mon 09:00-09:00", "Mon 25:00-26:00",
     "Mon 09:60-10:00", "Mon 09:00-10:00,", "Mon 24:00-10:00"],
)  # fmt: skip
def test_bad_windows_are_refused(spec: str) -> None:
    """A malformed window is a ValueError that says what is wrong."""
    with pytest.raises(ValueError):
        parse_window(spec)


def test_bad_zones_are_refused() -> None:
    """A name that is no IANA zone is a ValueError; a real one is the zone."""
    for name in ("Mars/Olympus", "", " UTC", "../etc/passwd"):
        with pytest.raises(ValueError):
            zone(name)
    assert zone("Europe/Paris") == ZoneInfo("Europe/Paris")


def test_a_not_before_without_a_zone_is_read_in_each_rows_own_zone() -> None:
    """`--not-before 2030-12-24T09:00` (no zone) is 09:00 on each row's wall clock: its
    `tz` column first, else `--tz`; one with an offset is the same instant for every row."""
    rows = [
        BatchRow(line=n + 2, seq=n + 1, item_id=str(n + 1), to=f"u{n}@example.com",
                 subject="s", body="b", channel="outbox", data=data)
        for n, data in enumerate(
            [{"tz": "Europe/Paris"}, {"tz": "America/New_York"}, {"tz": ""}]
        )
    ]  # fmt: skip
    local = from_options("2030-12-24T09:00", "Asia/Tokyo", None, {})
    problems = Problems()
    starts = [row.not_before for row in schedule_stream(rows, local, problems)]
    assert not problems
    assert starts == [
        "2030-12-24T08:00:00.000000+00:00",  # 09:00 in Paris
        "2030-12-24T14:00:00.000000+00:00",  # 09:00 in New York
        "2030-12-24T00:00:00.000000+00:00",  # no tz column: 09:00 in --tz Tokyo
    ]
    fixed = from_options("2030-12-24T09:00+00:00", "Asia/Tokyo", None, {})
    same = [row.not_before for row in schedule_stream(rows, fixed, Problems())]
    assert same == ["2030-12-24T09:00:00.000000+00:00"] * 3


def test_a_time_shown_to_the_operator_is_rounded_up_to_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pause that ends a fraction of a second before 04:00 (a wake worked out on the
    monotonic clock) is said to end at 04:00:00, not 03:59:59, a second before the window
    it waits for opens; a whole second stays as it is."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert clock.local("2026-12-07T03:59:59.999800+00:00") == "2026-12-07 04:00:00 UTC"
        assert clock.local("2026-12-07T04:00:00.000000+00:00") == "2026-12-07 04:00:00 UTC"
    finally:
        monkeypatch.undo()
        time.tzset()
