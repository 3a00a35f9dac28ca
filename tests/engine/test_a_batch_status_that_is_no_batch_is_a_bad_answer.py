"""Polling a chunk's batch reads the API's answer as a server's: an answer that is not a
batch (not JSON, or without its processing status) stops drafting with the contract's exit
3, the chunk kept `submitted` for `resume` to poll again, never an internal error (exit 1)
or a poll that never ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..conftest import Workspace
from ..fake_messages import Canned, FakeBatches, serving
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatches]:
    server = FakeBatches()
    with serving(monkeypatch, server):
        yield server


@pytest.mark.parametrize(
    "answer",
    [Canned(200, {"jsonl": "not JSON"}), Canned(200, {"id": "msgbatch_0001", "type": "x"})],
    ids=["not-json", "no-status"],
)
def test_a_status_answer_that_is_no_batch_stops_drafting_to_resume(
    ws: Workspace, fake: FakeBatches, answer: Canned
) -> None:
    fake.retrieve_script.extend([answer] * 20)
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
    assert result.exit_code == 3, result.output
    assert [c["state"] for c in ws.ledger.draft_chunks()] == ["submitted"]
    fake.retrieve_script.clear()
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(fake.created()) == 1
