"""An answer from the Claude APIs is JSON, and JSON may spell a lone UTF-16 surrogate
(`"\\ud800"`): Python reads it as a str that no UTF-8 store, log or terminal can encode. A
draft holding one (in its subject or body) is an unusable answer that fails its row with
its tokens, a model name holding one is no model named, and an API error message holding
one is kept with the character shown as U+FFFD: the other rows are drafted and sent and the
command ends with the contract's exit 3, never an internal error (exit 1) that leaves the
run half-drafted, nor (through Message Batches) a stop that every `resume` meets again."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeBatches, FakeMessages, error, serving, tool_answer
from .test_compose import batch, brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

LONE = "\ud800"

MESSAGES_CASES = {
    "in-the-subject": [tool_answer(f"Your plan {LONE} renews", "Body")],
    "in-the-body": [tool_answer("Your plan", f"It renews {LONE}next week.")],
    "in-the-model": [tool_answer("Your plan", "It renews.", model=f"claude{LONE}")],
    "in-a-400-message": [error(400, "invalid_request_error", f"bad {LONE} request")],
}


def outcome(ws: Workspace) -> dict[str, str]:
    return {i["id"]: i["state"] for i in ws.status()["items"]}


@pytest.mark.parametrize("case", list(MESSAGES_CASES))
def test_a_lone_surrogate_in_a_messages_answer_fails_its_row_only(
    ws: Workspace, fake: FakeMessages, case: str
) -> None:
    fake.per_row["u1"] = deque(MESSAGES_CASES[case])
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "internal error" not in result.output
    assert [d["item_id"] for d in ws.outbox_documents()] == ["u2"]
    assert outcome(ws) == {"u1": "failed", "u2": "sent"}
    [failed] = [d for d in ws.ledger.drafts() if d["state"] == "failed"]
    assert LONE not in str(failed["error"])
    assert fake.rows_requested().count("u1") == 1  # failed, not left to be asked again


def test_a_server_error_said_with_a_lone_surrogate_leaves_its_row_for_resume(
    ws: Workspace, fake: FakeMessages, fast_waits: float
) -> None:
    fake.per_row["u1"] = deque([error(500, "api_error", f"broken {LONE} here")] * 5)
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "internal error" not in result.output
    assert "not made yet" in result.output
    drafts = {d["seq"]: d["state"] for d in ws.ledger.drafts()}
    assert drafts == {1: "pending", 2: "drafted"}


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatches]:
    with serving(monkeypatch, FakeBatches()) as server:
        assert isinstance(server, FakeBatches)
        yield server


@pytest.mark.parametrize("where", ["draft", "error"])
def test_a_lone_surrogate_in_a_batch_result_fails_its_row_only(
    ws: Workspace, batches: FakeBatches, where: str
) -> None:
    if where == "draft":
        batches.per_row["u1"] = deque([tool_answer("Your plan", f"It renews {LONE}.")])
    else:
        batches.error_once["u1"] = ("invalid_request_error", f"bad {LONE} request")
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
    assert result.exit_code == 3, result.output
    assert "internal error" not in result.output
    assert outcome(ws) == {"u1": "failed", "u2": "sent"}
    assert [d["item_id"] for d in ws.outbox_documents()] == ["u2"]
    assert len(batches.created()) == 1
