"""A time zone name that is a region of the zone database (`Europe`, `America`, `Etc`) and not
a zone is bad input like any other name that is no zone: exit 2 naming the option or the
line, nothing stored, never an internal error (exit 1). zoneinfo raises IsADirectoryError
for such a name, not ZoneInfoNotFoundError."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("name", ["Europe", "America", "Etc"])
def test_a_tz_option_naming_a_region_exits_2_naming_the_option(ws: Workspace, name: str) -> None:
    batch = ws.write_csv("b.csv", [["to", "subject", "body"], ["a@example.com", "s", "b"]])
    result = ws.invoke("send", str(batch), "--tz", name, "--window", "Mon-Fri 09:00-18:00")
    assert result.exit_code == 2, result.output
    assert "--tz" in result.output and "internal error" not in result.output, result.output
    assert not ws.has_database() or ws.ledger.runs() == []
    assert ws.outbox_documents() == []


@pytest.mark.parametrize("name", ["Europe", "America"])
def test_a_tz_cell_naming_a_region_exits_2_naming_its_line(ws: Workspace, name: str) -> None:
    batch = ws.write_csv(
        "b.csv",
        [["to", "subject", "body", "tz"], ["a@example.com", "s", "b", "UTC"],
         ["b@example.com", "s", "b", name]],
    )  # fmt: skip
    result = ws.invoke("send", str(batch), "--window", "Mon-Fri 09:00-18:00")
    assert result.exit_code == 2, result.output
    assert "line 3" in result.output and "internal error" not in result.output, result.output
    assert not ws.has_database() or ws.ledger.runs() == []
    assert ws.outbox_documents() == []
