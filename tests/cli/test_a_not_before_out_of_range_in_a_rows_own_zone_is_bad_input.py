"""`--not-before` without a zone is a wall-clock time in each row's own `tz`: a time inside
the accepted range (1900-01-01 to 9000-01-01 UTC) read in UTC may fall outside it in a row's
zone. That is bad input naming the option, nothing stored, as the same value given with that
zone is, never an internal error (exit 1)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)


def test_a_not_before_without_a_zone_out_of_range_in_a_rows_zone_exits_2(ws: Workspace) -> None:
    """`--not-before` without a zone is read on each row's own `tz` wall clock: a time inside
    the range in UTC may fall outside it in the row's zone. That is bad input naming the line
    (as a `not_before` cell out of range is), never an internal error."""
    batch = ws.write_csv(
        "b.csv",
        [["to", "subject", "body", "tz"], ["a@example.com", "s", "b", "America/Los_Angeles"]],
    )
    result = ws.invoke("send", str(batch), "--not-before", "8999-12-31T20:00:00")
    assert result.exit_code == 2, result.output
    assert "out of range" in result.output and "line 2" in result.output, result.output
    assert "internal error" not in result.output, result.output
    assert not ws.has_database() or ws.ledger.runs() == []
