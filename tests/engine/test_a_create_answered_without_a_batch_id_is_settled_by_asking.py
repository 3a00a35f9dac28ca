"""`batches.create` answered 200 but without a batch id (left out, or a body that is not
JSON) made a batch all the same, maybe: it is a create in doubt, settled by asking as a
lost answer is (the batch carrying the chunk's custom_ids adopted, none created twice).
Recorded as `submitted` with no batch id, the chunk failed every command on it after,
`resume` included, with an internal error (exit 1)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..conftest import Workspace
from ..fake_messages import Canned, FakeBatches, serving
from .test_compose import batch, brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]
Body = dict[str, Any]


class AnswersCreateWith(FakeBatches):
    """FakeBatches whose first create makes its batch, then answers `answer(body)`."""

    def __init__(self, answer: Callable[[Body], Body]) -> None:
        super().__init__()
        self.answer, self.first = answer, True

    def on_post(self, path: str, payload: dict[str, Any]) -> Canned:
        made = super().on_post(path, payload)
        if path == "/v1/messages/batches" and self.first:
            self.first = False
            return Canned(200, self.answer(made.body))
        return made


def serve(monkeypatch: pytest.MonkeyPatch, server: FakeBatches) -> Iterator[FakeBatches]:
    with serving(monkeypatch, server):
        yield server


@pytest.mark.parametrize(
    "answer",
    [
        lambda body: {k: v for k, v in body.items() if k != "id"},
        lambda body: {**body, "id": ""},
        lambda body: {"jsonl": "not JSON"},
    ],
    ids=["no-id", "empty-id", "not-json"],
)
def test_the_batch_a_create_answered_without_its_id_made_is_adopted(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, answer: Callable[[Body], Body]
) -> None:
    for fake in serve(monkeypatch, AnswersCreateWith(answer)):
        result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
        assert result.exit_code == 0, result.output
        assert "adopted" in result.output
        assert len(fake.created()) == 1
        assert sorted(d["item_id"] for d in ws.outbox_documents()) == ["u1", "u2"]
