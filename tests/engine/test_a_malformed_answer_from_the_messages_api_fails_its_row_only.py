"""claude_messages.py: "a malformed answer fails that row only". An answer with status 200
whose body is not the Message the SDK expects (no usage, no content, content not a list,
not an object, not JSON, token counts that are not numbers) is a server's bad answer: its
row fails saying so, the other rows are drafted and sent, and the command ends with the
contract's exit 3, never an internal error (exit 1) that leaves every row undrafted."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from ..conftest import Workspace
from ..fake_messages import Canned, FakeMessages, tool_answer
from .test_compose import batch, brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]
GONE = object()


def answer(**changes: Any) -> Canned:
    """The well-formed draft answer with `changes` (GONE: that field left out)."""
    body = {**tool_answer("Subject", "Body").body, **changes}
    return Canned(200, {k: v for k, v in body.items() if v is not GONE})


@pytest.mark.parametrize(
    "canned",
    [
        answer(usage=GONE),
        answer(content=GONE),
        answer(content="a string, not blocks"),
        answer(usage={"input_tokens": "lots", "output_tokens": None}),
        Canned(200, {"hello": "world"}),
        Canned(200, ["not", "an", "object"]),
        Canned(200, {"jsonl": "not JSON at all"}),
    ],
    ids=["no-usage", "no-content", "content-a-string", "usage-not-numbers", "no-message",
         "a-list", "not-json"],
)  # fmt: skip
def test_a_malformed_answer_fails_its_row_and_the_others_are_sent(
    ws: Workspace, fake: FakeMessages, canned: Canned
) -> None:
    fake.per_row["u1"] = deque([canned])
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "malformed answer" in result.output
    assert [d["item_id"] for d in ws.outbox_documents()] == ["u2"]
    states = {i["id"]: i["state"] for i in ws.status()["items"]}
    assert states == {"u1": "failed", "u2": "sent"}
