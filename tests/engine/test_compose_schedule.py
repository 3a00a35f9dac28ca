"""`send --compose` takes --not-before, --tz and --window like any other send: each composed
row goes out when the same row of a plain send would (its start time, window and zone, its
`not_before` and `tz` columns kept out of its data), though its intent is frozen only once
every row is drafted, perhaps by a later `resume`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from notifier.content import schedule
from notifier.content.batch_csv import BatchRow, Problems
from notifier.domain import clock

from ..conftest import Workspace, postgres_schema
from ..fake_messages import FakeMessages, error

pytestmark = pytest.mark.both_stores

KEY = "sk-ant-test-0123456789"
# A Monday, years ahead: every start time below is decided by the options, never by `now`.
SCHEDULE = (
    "--not-before", "2031-03-03T08:00:00", "--tz", "Europe/Berlin",
    "--window", "Mon-Fri 09:00-17:00",
)  # fmt: skip


@pytest.fixture
def other(ws: Workspace, request: pytest.FixtureRequest) -> Iterator[Workspace]:
    """A second database on the store of `ws`, for the plain send to compare with."""
    if ws.store == "sqlite":
        (ws.path / "plain").mkdir()
        yield Workspace(ws.path / "plain")
        return
    server = request.getfixturevalue("postgres_server")
    with postgres_schema(server) as url, closing(Workspace(ws.path, url=url)) as workspace:
        yield workspace


def three_zones(ws: Workspace) -> Path:
    """Rows in New York, Tokyo and (no `tz`: --tz) Berlin; one with its own later start,
    one with its own offset, one whose window opens only after its deadline."""
    return ws.write_csv(
        "zones.csv",
        [
            ["id", "to", "name", "tz", "not_before", "not_after"],
            ["ny", "ny@example.com", "Ann", "America/New_York", "", ""],
            ["tokyo", "tk@example.com", "Bo", "Asia/Tokyo", "2031-03-05T10:30:00", ""],
            ["berlin", "be@example.com", "Cy", "", "", ""],
            ["offset", "of@example.com", "Di", "Asia/Tokyo", "2031-03-04T01:00:00+00:00", ""],
            ["late", "la@example.com", "Ed", "America/New_York", "", "2031-03-03T12:00:00+00:00"],
        ],
    )


def scheduled(ws: Workspace) -> list[tuple[Any, ...]]:
    """Each item's id, start time, window, zone, identity and data columns, in file order."""
    names = ("item_id", "not_before", "send_window", "send_tz", "identity", "data")
    return [tuple(s[name] for name in names) for s in ws.ledger.schedules()]


@pytest.mark.parametrize("frozen_by", ["send", "resume"])
def test_a_composed_row_is_scheduled_as_the_same_row_of_a_plain_send(
    ws: Workspace, fake: FakeMessages, other: Workspace, frozen_by: str
) -> None:
    """--not-before without a zone (each row's own wall clock), --tz, --window, and rows'
    own `tz` and `not_before`: the composed run's items have the start time, window and
    zone, identity and data of the plain run's, and both warn of the row that cannot make
    its deadline; so too when drafting stopped (a 401) and a later `resume` froze them."""
    file = three_zones(ws)
    brief = ws.path / "brief.txt"
    brief.write_text("Say hello.", "utf-8")
    if frozen_by == "resume":
        fake.script.extend(error(401, "authentication_error", "bad key") for _ in range(5))
    composed = ws.invoke(
        "send", str(file), "--compose", str(brief), "--require-approval", *SCHEDULE
    )
    if frozen_by == "resume":
        assert composed.exit_code == 3, composed.output
        assert ws.ledger.items() == []  # nothing frozen yet
        fake.script.clear()
        resumed = ws.invoke("resume")
        assert resumed.exit_code == 0, resumed.output
    else:
        assert composed.exit_code == 0, composed.output
    plain = ws.invoke("send", str(file), "--require-approval", *SCHEDULE, "--db", str(other.db))
    assert plain.exit_code == 0, plain.output
    for result in (composed, plain):
        assert "1 row(s) cannot be sent before their not_after" in result.stderr
        assert "line(s) 6." in result.stderr
    got, want = scheduled(ws), scheduled(other)
    assert got == want
    assert [g[0] for g in got] == ["ny", "tokyo", "berlin", "offset", "late"]
    assert all(data == {"name": data["name"]} for *_, data in got)  # no tz, no not_before
    # Spot checks against the calendar: 09:00 in each zone on the Monday, or later.
    starts = {g[0]: g[1] for g in got}
    assert starts["ny"] == "2031-03-03T14:00:00.000000+00:00"  # 09:00 EST
    assert starts["berlin"] == "2031-03-03T08:00:00.000000+00:00"  # 09:00 CET
    assert starts["tokyo"] == "2031-03-05T01:30:00.000000+00:00"  # its own 10:30 JST
    assert starts["offset"] == "2031-03-04T01:00:00.000000+00:00"  # 10:00 JST, open
    assert {g[2] for g in got} == {"Mon-Fri 09:00-17:00"}
    assert [g[3] for g in got] == [
        "America/New_York", "Asia/Tokyo", "Europe/Berlin", "Asia/Tokyo", "America/New_York",
    ]  # fmt: skip
    prompts = [json.dumps(r.body) for r in fake.requests]
    assert prompts and not any("America/New_York" in p or "10:30:00" in p for p in prompts)


def test_a_bad_zone_in_a_composed_file_is_refused_before_any_draft(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A `tz` cell that names no zone: exit 2 naming its line, no request, nothing stored."""
    file = ws.write_csv("bad.csv", [["id", "to", "tz"], ["a", "a@example.com", "Mars/Olympus"]])
    brief = ws.path / "brief.txt"
    brief.write_text("Say hello.", "utf-8")
    result = ws.invoke("send", str(file), "--compose", str(brief), "--window", "Mon 09:00-10:00")
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and "Mars/Olympus" in result.output
    assert fake.requests == [] and not ws.has_database()


def test_a_composed_row_read_in_its_window_and_frozen_after_it_waits_for_the_next_opening(
    ws: Workspace, fake: FakeMessages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read on Monday at 17:30 in Berlin, its window open until 18:00; drafted and frozen at
    18:30: the item starts on Tuesday at 09:00, as a plain send at 18:30 would have it."""
    read_at = datetime(2031, 3, 3, 16, 30, tzinfo=UTC)
    frozen_at = read_at + timedelta(hours=1)
    monkeypatch.setattr(clock, "now", lambda: frozen_at if fake.requests else read_at)
    file = ws.write_csv("one.csv", [["id", "to", "tz"], ["a", "a@example.com", "Europe/Berlin"]])
    brief = ws.path / "brief.txt"
    brief.write_text("Say hello.", "utf-8")
    window = ("--window", "Mon-Fri 09:00-18:00")
    result = ws.invoke("send", str(file), "--compose", str(brief), "--require-approval", *window)
    assert result.exit_code == 0, result.output
    [source] = [d["source"] for d in ws.ledger.drafts()]
    assert json.loads(source)["not_before"] == clock.iso(read_at)  # scheduled when read
    assert [s["not_before"] for s in ws.ledger.schedules()] == ["2031-03-04T08:00:00.000000+00:00"]


@pytest.mark.parametrize("hours_later", [0.5, 9, 30, 24 * 5 + 3])
def test_a_row_frozen_later_starts_where_a_row_planned_then_would(hours_later: float) -> None:
    """A composed row is scheduled when its file is read and timed again when frozen: the
    result is what scheduling it at the freeze would have given (a row read inside its
    window but frozen after it closed waits for the next opening)."""
    read_at = datetime(2031, 3, 3, 16, 30, tzinfo=UTC)  # Monday 17:30 in Berlin
    frozen_at = read_at + timedelta(hours=hours_later)
    row = BatchRow(seq=1, line=2, item_id="a", to="a@example.com", channel="outbox",
                   subject="", body="", data={"tz": "Europe/Berlin"})  # fmt: skip

    def planned(now: datetime) -> BatchRow:
        when = schedule.from_options(None, None, "Mon-Fri 09:00-18:00", {})
        when.now = now
        problems = Problems()
        [out] = schedule.schedule_stream([row], when, problems)
        assert not problems.count
        return out

    assert schedule.retime(planned(read_at), frozen_at) == planned(frozen_at)
