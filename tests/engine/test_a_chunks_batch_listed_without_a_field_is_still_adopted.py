"""Settling a create in doubt lists the batches made since the chunk's intent. A listed
batch whose creation time or request counts the listing leaves out (a server's bad answer:
the SDK builds its objects without checking them) may still be the chunk's, and only its
results can tell: the chunk's own batch listed so is still found and adopted, none is
created twice, and the command never ends in an internal error (exit 1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import Workspace
from ..fake_messages import Canned, FakeBatches, error, serving
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)


class LosesCreateAndListsWithout(FakeBatches):
    """The first create makes its batch and answers 500; every listing leaves `drop` out
    of the newest batch."""

    def __init__(self, drop: str) -> None:
        super().__init__()
        self.drop, self.lose = drop, True

    def on_post(self, path: str, payload: dict[str, Any]) -> Canned:
        made = super().on_post(path, payload)
        if path == "/v1/messages/batches" and self.lose:
            self.lose = False
            return error(500, "api_error", "lost answer")
        return made

    def on_get(self, path: str) -> Canned:
        answer = super().on_get(path)
        if path.partition("?")[0] == "/v1/messages/batches" and answer.body.get("data"):
            newest, *rest = answer.body["data"]
            newest = {k: v for k, v in newest.items() if k != self.drop}
            return Canned(200, {**answer.body, "data": [newest, *rest]})
        return answer


def serve(monkeypatch: pytest.MonkeyPatch, server: FakeBatches) -> Iterator[FakeBatches]:
    with serving(monkeypatch, server):
        yield server


@pytest.mark.parametrize("drop", ["created_at", "request_counts"])
def test_the_chunks_batch_listed_without_a_field_is_still_adopted(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, drop: str
) -> None:
    for fake in serve(monkeypatch, LosesCreateAndListsWithout(drop)):
        result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
        assert result.exit_code == 0, result.output
        assert "adopted" in result.output and len(fake.created()) == 1
