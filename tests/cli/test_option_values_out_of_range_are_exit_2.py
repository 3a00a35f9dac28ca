"""A value an option parses but no run could use (a time past the last date Python holds
once its zone is applied, a rate of one send in millennia, an approval valid for longer
than any date) is bad input: exit 2 naming the option and what it accepts, nothing stored,
never an overflow (exit 1) once the run is under way."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)

SEND_OPTIONS = {
    "not-before-past-the-last-date": (
        ["--not-before", "9999-12-31T23:59:59-05:00"],
        "--not-before",
    ),
    "not-after-past-the-last-date": (["--not-after", "9999-12-31T23:59:59-05:00"], "--not-after"),
    "not-before-before-the-first-date": (
        ["--not-before", "0001-01-01T00:00:00+05:00"],
        "--not-before",
    ),
    "not-before-with-a-window-past-the-last-date": (
        ["--not-before", "9999-12-31T23:00:00Z", "--window", "Mon 09:00-10:00"],
        "--not-before",
    ),
}


@pytest.mark.parametrize("case", sorted(SEND_OPTIONS))
def test_a_send_option_out_of_range_exits_2_and_stores_nothing(ws: Workspace, case: str) -> None:
    """A --not-before or --not-after whose zone or window would carry it past the dates
    Python holds is exit 2 naming the option, before the run is stored."""
    args, named = SEND_OPTIONS[case]
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), *args)
    assert result.exit_code == 2, result.output
    assert named in result.output and "out of range" in result.output, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert not ws.has_database() or ws.ledger.runs() == []


@pytest.mark.parametrize("rate", ["1e-12", "inf", "nan"])
@pytest.mark.parametrize("command", ["send", "resume"])
def test_a_rate_slower_than_one_send_a_day_or_not_finite_exits_2(
    ws: Workspace, command: str, rate: str
) -> None:
    """`--rate` is a finite number of sends per second, at least one a day: 1e-12 would wait
    millennia between two sends and overflow the pause it names. Exit 2 naming --rate, the
    run not stored (send) or not touched (resume)."""
    batch = ws.write_csv("b.csv", make_rows(2))
    if command == "resume":
        assert ws.invoke("send", str(batch), "--require-approval").exit_code == 0
        before = [(i.item_id, i.state) for i in ws.ledger.items()]
        result = ws.invoke("resume", "--rate", rate)
        assert [(i.item_id, i.state) for i in ws.ledger.items()] == before
    else:
        result = ws.invoke("send", str(batch), "--rate", rate)
        assert not ws.has_database() or ws.ledger.runs() == []
    assert result.exit_code == 2, result.output
    assert "--rate" in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("where", ["column", "option"])
def test_a_never_expires_deadline_of_9999_12_31_is_kept_and_the_row_sent(
    ws: Workspace, where: str
) -> None:
    """`9999-12-31` in UTC, the "never expires" of spreadsheets and databases, is a deadline
    like any other (only a zone that carries it past the last date is refused): the row is
    sent, and `status` and `report` show the deadline."""
    rows = [["id", "to", "subject", "body"], ["x1", "a@example.org", "s", "b"]]
    args: list[str] = []
    if where == "column":
        rows = [[*rows[0], "not_after"], [*rows[1], "9999-12-31T23:59:59Z"]]
    else:
        args = ["--not-after", "9999-12-31T23:59:59Z"]
    batch = ws.write_csv("b.csv", rows)
    result = ws.invoke("send", str(batch), *args)
    assert result.exit_code == 0, result.output
    for command in (["status"], ["report"], ["report", "--format", "json"]):
        shown = ws.invoke(*command)
        assert shown.exit_code == 0, (command, shown.output)
