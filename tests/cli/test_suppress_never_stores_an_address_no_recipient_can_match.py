"""`suppress add` and `suppress import` saying "suppressed 1 address(es)" is a promise that
the address is never mailed. An entry spelled so that no row's recipient is ever keyed like
it (an invisible character such as the byte-order mark a joined export leaves at the start
of a line, a zero-width space pasted from a web page, angle brackets or a `mailto:` copied
from a header, quotes, a trailing dot) would be stored, listed, and match nobody: the person
who asked to stop would be mailed. Such a spelling is refused (exit 2, naming it and the fix,
nothing stored), and a file without a header whose first line is such a spelling is never
taken for a header and skipped."""

from __future__ import annotations

import csv
import io
import json

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]

SPELLINGS = [
    "\ufeffbob@example.com",  # a byte-order mark where two exports were joined
    "bob@example.com\u200b",  # a zero-width space pasted with the address
    "\u200ebob@example.com",  # a left-to-right mark
    "bob\u00ad@example.com",  # a soft hyphen
    "<bob@example.com>",
    "mailto:bob@example.com",
    '"bob"@example.com',
    "bob@example.com.",
    "bob@example.com;",
]


def csv_text(*rows: list[str]) -> str:
    """Rows as a CSV file holds them (a quoted local part has its quotes doubled)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def listed(ws: Workspace) -> list[str]:
    result = ws.invoke("suppress", "list", "--json")
    assert result.exit_code == 0, result.output
    return [s["address"] for s in json.loads(result.stdout)["suppressions"]]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_suppress_add_refuses_a_spelling_no_recipient_can_match(
    ws: Workspace, spelling: str
) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    result = ws.invoke("suppress", "add", spelling)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "nothing was stored" in result.output
    assert "local@domain" in result.output
    assert listed(ws) == ["keep@example.com"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_suppress_import_refuses_a_file_holding_such_a_spelling(
    ws: Workspace, spelling: str
) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    text = csv_text(["address", "reason"], ["ann@example.com", "bounced"], [spelling, "bounced"])
    (ws.path / "bounced.csv").write_text("\ufeff" + text, encoding="utf-8")
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 2, result.output
    assert "line 3:" in result.output and "nothing was stored" in result.output
    assert "Traceback" not in result.output
    assert listed(ws) == ["keep@example.com"]


@pytest.mark.parametrize("spelling", [*SPELLINGS, "bob@", "bob smith@example.com"])
def test_a_headerless_file_whose_first_line_is_such_a_spelling_is_refused_not_skipped(
    ws: Workspace, spelling: str
) -> None:
    """Without a header the first line is data when it holds an `@`: refused when it is no
    address the list can hold, never taken for a header and left out while the rest is
    stored."""
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    # Saved as a spreadsheet saves it: with a byte-order mark in front (read as none).
    text = csv_text([spelling], ["ann@example.com"])
    (ws.path / "plain.csv").write_text("\ufeff" + text, encoding="utf-8")
    result = ws.invoke("suppress", "import", "plain.csv")
    assert result.exit_code == 2, result.output
    assert "line 1:" in result.output and "nothing was stored" in result.output
    assert listed(ws) == ["keep@example.com"]
