"""Text that comes from users or downstreams (item ids, evidence, file names, errors) is shown
literally by every table: never read as markup, never able to break a command."""

from __future__ import annotations

from ..conftest import Inbox, Workspace
from ..support.crashed import crash_send


def test_markup_like_ids_evidence_and_file_names_print_literally(
    ws: Workspace, inbox: Inbox
) -> None:
    """`[/x]` as an item id and in evidence, and `march[final].csv` as the batch name, leave
    status, report and runs working and are printed exactly as written."""
    rows = [
        ["id", "to", "subject"],
        ["[/x]", "a@example.com", "hi"],
        ["[b]", "b@example.com", "yo"],
    ]
    ws.write_csv("march[final].csv", rows)
    crash_send("after-send:1", "march[final].csv", db=ws.db, channel="mail")
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 3, resumed.output  # item 1 is unknown on SMTP
    status = ws.invoke("status")
    assert status.exit_code == 0, status.output
    assert "[/x]" in status.output
    marked = ws.invoke("reconcile", "--manual", "--item", "[/x]", "--mark", "sent",
                       "--evidence", "relay log says [/x] [red]delivered")  # fmt: skip
    assert marked.exit_code == 0, marked.output
    report = ws.invoke("report")
    assert report.exit_code == 0, report.output
    assert "[red]delivered" in report.output
    runs = ws.invoke("runs")
    assert runs.exit_code == 0, runs.output
    assert "march[final].csv" in runs.output
