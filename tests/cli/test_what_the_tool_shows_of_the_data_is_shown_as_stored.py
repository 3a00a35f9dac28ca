"""What the tool shows of the data is shown exactly as stored: a batch's file name, a
suppression's reason, a rejection's reason in the tables of `runs`, `suppress list` and
`status` print `:fire:` or `:x:` as written (rich's tables would make them emoji), as they
print `[/x]` as written (markup off)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60)]

ROWS = [["id", "to", "subject", "body"], ["a1", "ann@example.com", "Sale", "Hello"]]


def test_runs_shows_the_batch_name_as_stored(ws: Workspace) -> None:
    ws.write_csv("promo:fire:.csv", ROWS)
    assert ws.invoke("send", "promo:fire:.csv").exit_code == 0
    shown = ws.invoke("runs")
    assert "promo:fire:.csv" in shown.output, shown.output


def test_suppress_list_shows_the_reason_as_stored(ws: Workspace) -> None:
    assert (
        ws.invoke("suppress", "add", "ann@example.com", "--reason", "said :x: stop").exit_code == 0
    )
    shown = ws.invoke("suppress", "list")
    assert "said :x: stop" in shown.output, shown.output


def test_status_shows_a_rejection_reason_as_stored(ws: Workspace) -> None:
    ws.write_csv("b.csv", ROWS)
    assert ws.invoke("send", "b.csv", "--require-approval").exit_code == 0
    rejected = ws.invoke("reject", "--reason", "price :x: wrong")
    assert rejected.exit_code == 0, rejected.output
    shown = ws.invoke("status")
    assert "price :x: wrong" in shown.output, shown.output
