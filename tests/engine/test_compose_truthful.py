"""Drafting that reports truthfully: failed drafts count as failed, usage is kept
for unusable answers, drafted text meets the CSV's rules, the model is checked before
anything is stored, `resume --model`, and `--compose-columns`."""

from __future__ import annotations

import json
from collections import deque

import pytest

from ..conftest import DB_ERRORS, Workspace
from ..fake_messages import FakeMessages, error, text_only_answer, tool_answer
from .test_compose import batch, brief

pytestmark = pytest.mark.both_stores


def drafted(ws: Workspace) -> int:
    """Rows drafted so far, on either store (0 while the tables are not there yet)."""
    try:
        return [d["state"] for d in ws.ledger.drafts()].count("drafted")
    except DB_ERRORS:
        return 0


def test_a_failed_draft_counts_as_failed_with_its_reason_and_its_tokens(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A malformed answer fails its row: the run's summary, status and runs count it as
    failed with the API's reason, and the unusable answer's tokens are counted."""
    fake.per_row["u2"] = deque([text_only_answer()])
    result = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "2 sent" in result.output and "1 failed" in result.output
    status = ws.status()
    assert status["counts"]["total"] == 3 and status["counts"]["failed"] == 1
    [failed] = [i for i in status["items"] if i["state"] == "failed"]
    assert failed["id"] == "u2" and "no notification_draft tool call" in failed["last_error"]
    assert status["drafts"]["input_tokens"] == 3 * 11
    assert status["drafts"]["output_tokens"] == 7 + 7 + 9
    runs = ws.invoke("runs")
    assert "│     3 │" in runs.output.replace("┃", "│"), runs.output


def test_every_draft_failing_is_a_run_of_failed_rows_not_an_empty_one(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Five malformed answers: the run reports 5 failed (exit 3), never `0 failed`."""
    fake.script.extend(text_only_answer() for _ in range(5))
    result = ws.invoke("send", str(batch(ws, 5)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "0 sent" in result.output and "5 failed" in result.output
    assert ws.status()["counts"] == {**ws.status()["counts"], "total": 5, "failed": 5}


@pytest.mark.parametrize(
    ("subject", "body", "reason"),
    [
        ("Hello", "line one\x00 NUL", "body contains a control character (U+0000)"),
        ("Hello", "an \x1b[31mESC\x1b[0m", "body contains a control character (U+001B)"),
        ("Bell\x07", "fine", "subject contains a control character (U+0007)"),
        ("x" * 999, "fine", "subject is 999 characters, over 998"),
    ],
)
def test_drafted_text_is_held_to_the_csv_rules(
    ws: Workspace, fake: FakeMessages, subject: str, body: str, reason: str
) -> None:
    """A draft with a control character (newline and tab aside) or too long a subject fails
    that row with a clear reason; it never reaches the outbox."""
    fake.per_row["u1"] = deque([tool_answer(subject, body)])
    fake.per_row["u2"] = deque([tool_answer("Two\nlines", "tab\there\nnewline ok")])
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert reason in result.output
    docs = ws.outbox_documents()
    assert [(d["item_id"], d["subject"], d["body"]) for d in docs] == [
        ("u2", "Two lines", "tab\there\nnewline ok")
    ]


def test_an_unknown_model_exits_2_and_stores_nothing(ws: Workspace, fake: FakeMessages) -> None:
    """The Models API's 404 for --model: exit 2 naming the model, no database, no draft
    request."""
    fake.unknown_models.add("claude-nope")
    result = ws.invoke(
        "send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--model", "claude-nope"
    )
    assert result.exit_code == 2, result.output
    assert "'claude-nope'" in result.output and "nothing was stored" in result.output
    assert "Traceback" not in result.output
    assert not ws.has_database() and fake.requests == []
    assert fake.model_lookups == ["claude-nope"]


def test_compose_columns_choose_what_the_api_sees_and_to_is_left_out_by_default(
    ws: Workspace, fake: FakeMessages
) -> None:
    """By default every column but `to` goes to the API; --compose-columns id,to sends just
    those; an unknown column exits 2 before anything is stored or requested."""
    assert ws.invoke("send", str(batch(ws, 1)), "--compose", str(brief(ws))).exit_code == 0
    row = json.loads(fake.requests[-1].body["messages"][0]["content"].split("\n", 1)[1])
    assert row == {"id": "u1", "name": "User 1", "plan": "pro", "subject": "", "body": ""}
    ws.reset()
    chosen = ws.invoke(
        "send", str(batch(ws, 1)), "--compose", str(brief(ws)), "--compose-columns", "id,to"
    )
    assert chosen.exit_code == 0, chosen.output
    row = json.loads(fake.requests[-1].body["messages"][0]["content"].split("\n", 1)[1])
    assert row == {"id": "u1", "to": "user1@example.com"}
    ws.reset()
    before = len(fake.requests)
    refused = ws.invoke(
        "send", str(batch(ws, 1)), "--compose", str(brief(ws)), "--compose-columns", "id,city"
    )
    assert refused.exit_code == 2 and "'city' is not a column" in refused.output
    assert len(fake.requests) == before and not ws.has_database()


def test_status_shows_a_run_still_drafting_with_its_rows(ws: Workspace, fake: FakeMessages) -> None:
    """A run whose drafting stopped (401) shows its real total in status and runs, and says
    that its fingerprint is not computed yet."""
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    assert ws.invoke("send", str(batch(ws, 4)), "--compose", str(brief(ws))).exit_code == 3
    status = ws.status()
    assert status["counts"]["total"] == 4 and status["counts"]["pending"] == 4
    table = ws.invoke("status")
    assert "fingerprint: none yet" in table.output, table.output
