"""DESIGN.md section 8: `notifier cancel [RUN_ID] [--report] [--format table|json|csv]` ... "with
`--report` prints the report" — the report of `notifier report`, which names every item: who got
it (sent, with its receipt), who might have (unknown), who never will (pending, left unsent).
In the default table format too, not only as JSON or CSV: an operator who cancels a campaign
with `--report` must see whom it reached without running a second command."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(120)]


def test_cancel_report_in_a_table_names_every_item(ws: Workspace) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    crashed = ws.run(
        "send", "batch.csv", "--run-id", "r1", env={"NOTIFIER_CRASH_AT": "after-receipt:1"}
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    cancelled = ws.invoke("cancel", "r1", "--report")
    assert cancelled.exit_code == 3, cancelled.output  # rows left unsent
    report = ws.invoke("report", "r1").output
    # `report` names each item: sent (who got it) and left unsent (who never will).
    for text in ("user1@example.com", "user2@example.com", "user3@example.com"):
        assert text in report, report
    for text in ("user1@example.com", "user2@example.com", "user3@example.com"):
        assert text in cancelled.output, cancelled.output
    assert "left unsent" in cancelled.output, cancelled.output
