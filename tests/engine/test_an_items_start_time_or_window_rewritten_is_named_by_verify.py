"""When an item may be sent is decided by three columns of its row: `not_before` (its start
time), `send_window` and `send_tz` (the window a claim reopens it by, on that zone's wall
clock). None is part of its intent digest (content/schedule.py: an approval covers what is
sent, not when), so an editor without the key who moves a start time, widens a window or
changes its zone changes when the engine sends, while every payload, digest and event is as
written. The plan chains them (intent.Schedules) and a claim chains each start time it moves
(a `reopened` event): `verify` names a column rewritten behind them, and never a start
time the engine itself moved out of a window that had closed again. Both stores; databases
written before any of this was chained verify as they did."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import Channels, ScriptedChannel, always_deliver
from notifier.content.schedule import from_options
from notifier.domain import clock
from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace, make_rows
from ..support.audited import TOML, config, keyed, named, verdict, verdicts

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "windowed"
ZONE = "Asia/Kolkata"  # +05:30: a window read on another zone's clock is hours off
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
LATER = "2099-01-01T00:00:00.000000+00:00"


def an_hour_from(start: datetime) -> str:
    """A window open on ZONE's wall clock for the hour from `start` (it may cross
    midnight: a range whose end is before its start ends the next day)."""
    local = start.astimezone(ZoneInfo(ZONE))
    end = local + timedelta(hours=1)
    return f"{DAY_NAMES[local.weekday()]} {local:%H:%M:%S}-{end:%H:%M:%S}"


@pytest.fixture
def planned(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """Three items planned under the audit key inside a window open now, nothing sent."""
    keyed(monkeypatch)
    batch = ws.write_csv(f"{RUN}.csv", make_rows(3))
    schedule = from_options(None, ZONE, an_hour_from(datetime.now(UTC)), {})
    channel = ScriptedChannel("hooks", always_deliver, idempotent=False, queryable=False)
    opened = Notifier.open(ws.db, config=config(), channels=Channels(hooks=channel))
    opened.plan(Path(batch.name), channel="hooks", run_id=RUN, schedule=schedule)
    (ws.path / "notifier.toml").write_text(TOML)
    stored = ws.query("SELECT not_before, send_window, send_tz FROM items WHERE run_id = ?", (RUN,))
    assert len(stored) == 3 and all(None not in row for row in stored), stored
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ()), whole
    return ws


def reopened(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run worked two hours on, its window closed: the claim gives every item the
    window's next opening (next week) as its start time, sends nothing, and the run
    pauses."""
    before = [str(nb) for (nb,) in ws.query(
        "SELECT not_before FROM items WHERE run_id = ? ORDER BY seq", (RUN,))]  # fmt: skip
    monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))
    channel = ScriptedChannel("hooks", always_deliver, idempotent=False, queryable=False)
    opened = Notifier.open(ws.db, config=config(), channels=Channels(hooks=channel))
    result = opened.work(RUN, max_wait=1)
    assert result.counts.pending == 3, result
    after = [str(nb) for (nb,) in ws.query(
        "SELECT not_before FROM items WHERE run_id = ? ORDER BY seq", (RUN,))]  # fmt: skip
    assert all(
        clock.parse(a) - clock.parse(b) > timedelta(days=6)
        for a, b in zip(after, before, strict=True)
    ), (before, after)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("not_before", LATER),  # held back for decades
        ("send_window", "Mon-Sun 00:00-24:00"),  # sent at any hour
        ("send_tz", "UTC"),  # sent five and a half hours off
    ],
)
def test_an_items_start_time_window_or_zone_rewritten_is_named(
    planned: Workspace, column: str, value: str
) -> None:
    planned.write(f"UPDATE items SET {column} = ? WHERE run_id = ? AND seq = 2", (value, RUN))
    found = verdict(planned, RUN)
    assert found.verdict is AuditVerdict.ALTERED, found
    assert named(found) == {("items", "the run's items", "differs", column)}, found
    checked = planned.invoke("verify", RUN)
    assert checked.exit_code == 5, checked.output
    assert f"items: the run's items: {column} is" in checked.output, checked.output


def test_a_start_time_the_engine_moved_verifies_and_one_rewritten_after_is_named(
    planned: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    reopened(planned, monkeypatch)
    whole = verdict(planned, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ()), whole
    assert planned.invoke("verify", RUN).exit_code == 0
    planned.write("UPDATE items SET not_before = ? WHERE run_id = ? AND seq = 3", (LATER, RUN))
    found = verdict(planned, RUN)
    assert found.verdict is AuditVerdict.ALTERED, found
    assert named(found) == {("items", "item u3 (seq 3)", "differs", "not_before")}, found
    checked = planned.invoke("verify", RUN)
    assert checked.exit_code == 5, checked.output
    assert "items: item u3 (seq 3): not_before is '2099-01-01" in checked.output, checked.output


def test_a_start_time_rewritten_before_the_engine_moved_it_is_named(
    planned: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item's start time moved back an hour, then the claim moves it on to the window's
    next opening: the planned start time its move began from is not the one chained."""
    ((first,),) = planned.query("SELECT not_before FROM items WHERE run_id = ? AND seq = 1", (RUN,))
    earlier = clock.iso(clock.parse(str(first)) - timedelta(hours=1))
    planned.write("UPDATE items SET not_before = ? WHERE run_id = ? AND seq = 1", (earlier, RUN))
    reopened(planned, monkeypatch)
    found = verdict(planned, RUN)
    assert named(found) == {("items", "the run's items", "differs", "not_before")}, found


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("m009-inflight-run", AuditVerdict.UNSIGNED),  # windows stored, no chain yet
        ("m014-keyed-inflight-run", AuditVerdict.UNKEYED),  # chained, no schedule in it
        ("m022-ids-deadlines-and-crlf", AuditVerdict.UNKEYED),
    ],
)
def test_a_database_from_before_schedules_were_chained_verifies_as_it_did(
    ws: Workspace, fixture: str, expected: AuditVerdict
) -> None:
    ws.load_fixture(fixture)
    for v in verdicts(ws).values():
        assert (v.verdict, v.findings) == (expected, ()), v
