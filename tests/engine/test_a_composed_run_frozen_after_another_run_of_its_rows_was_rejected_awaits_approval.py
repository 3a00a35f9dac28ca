"""A rejected run holds its rows: the same file sent again waits for approval
(docs/guarantees.md). The rows are compared with the rejected runs when `send --compose`
stores its drafting run, but a composed run stays drafting (no intents) for as long as its
drafting takes, or until `resume`: a reviewer may reject another run of the same rows
meanwhile. The freeze, which compares the rows with every other run again (held_elsewhere),
must then make the run await approval too, never send the rejected rows unreviewed."""

from __future__ import annotations

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, error

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


def test_rows_rejected_while_another_composed_run_drafted_them_are_never_sent_unreviewed(
    ws: Workspace, fake: FakeMessages
) -> None:
    brief = ws.path / "brief.txt"
    brief.write_text("Tell each customer their plan renews next week.", "utf-8")
    ws.write_csv("d.csv", [["id", "to", "name"], ["u1", "user1@example.com", "User 1"]])
    refused = error(401, "authentication_error", "invalid x-api-key")
    fake.script.append(refused)
    first = ws.invoke(
        "send", "d.csv", "--compose", str(brief), "--require-approval", "--run-id", "reviewed"
    )
    assert first.exit_code == 3, first.output  # stopped while drafting: no intents yet
    reviewed = "reviewed"
    fake.script.append(refused)
    second = ws.invoke("send", "d.csv", "--compose", str(brief), "--run-id", "other")
    assert second.exit_code == 3, second.output  # nothing held its row: stored, drafting
    other = "other"
    fake.script.clear()
    frozen = ws.invoke("resume", reviewed)
    assert ws.ledger.run(reviewed).state == "awaiting_approval", frozen.output
    rejected = ws.invoke("reject", reviewed, "--reason", "not this week")
    assert rejected.exit_code == 0, rejected.output
    ws.invoke("resume", other)
    assert ws.outbox_documents() == [], "a row a reviewer rejected was sent without review"
