"""A composed run with ids that a reviewer rejected holds its rows as every rejected run
does: the same file sent again with its `id` column dropped (composed again, or sent plain)
is a new run that waits for approval, never drafted and sent unreviewed. A composed item's
intent digest is its drafted text's, so the rejection must find it by the content of the
row it was drafted from (drafts.source_digest), as the plan's own comparison does. On both
stores, through the CLI against the fake Messages API."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..fake_messages import FakeMessages
from .test_compose import brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]

ROWS = [["id", "to", "name", "plan"]] + [
    [f"u{i}", f"user{i}@example.com", f"User {i}", "pro"] for i in range(1, 3)
]


def _rejected_with_ids(ws: Workspace, rows: list[list[str]]) -> str:
    planned = ws.invoke(
        "send", str(ws.write_csv("c.csv", rows)), "--compose", str(brief(ws)), "--require-approval"
    )
    assert planned.exit_code == 0, planned.output
    (run,) = ws.ledger.runs()
    assert run.state == "awaiting_approval", run.state
    rejected = ws.invoke("reject", "--reason", "not this week")
    assert rejected.exit_code == 0, rejected.output
    return run.run_id


def test_a_rejected_composed_file_composed_again_without_its_ids_waits_for_approval(
    ws: Workspace, fake: FakeMessages
) -> None:
    rejected = _rejected_with_ids(ws, ROWS)
    again = ws.invoke(
        "send", str(ws.write_csv("c.csv", [r[1:] for r in ROWS])), "--compose", str(brief(ws))
    )
    assert again.exit_code == 0, again.output
    assert f"were rejected in run {rejected}" in again.output, again.output
    assert [run.state for run in ws.ledger.runs()] == ["cancelled", "awaiting_approval"]
    assert ws.outbox_documents() == []


def test_a_rejected_composed_file_sent_plain_without_its_ids_waits_for_approval(
    ws: Workspace, fake: FakeMessages
) -> None:
    rows = make_rows(2)
    rejected = _rejected_with_ids(ws, rows)
    again = ws.invoke("send", str(ws.write_csv("c.csv", [r[1:] for r in rows])))
    assert again.exit_code == 0, again.output
    assert f"were rejected in run {rejected}" in again.output, again.output
    assert [run.state for run in ws.ledger.runs()] == ["cancelled", "awaiting_approval"]
    assert ws.outbox_documents() == []
