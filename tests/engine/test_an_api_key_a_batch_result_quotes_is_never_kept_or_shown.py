"""The API key (ANTHROPIC_API_KEY) a downstream quotes back is masked before it is stored,
printed or reported — for the Message Batches API's per-row results as for the Messages
API's refusals (tests/engine/test_a_secret_a_downstream_echoes_is_never_kept_or_shown.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import Workspace
from ..fake_messages import KEY, FakeBatches
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatches]:
    server = FakeBatches()
    with server.running():
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("NOTIFIER_BATCH_CHUNK_ROWS", "2")
        monkeypatch.setenv("NOTIFIER_BATCH_POLL_S", "0.01")
        yield server


def stored_bytes(ws: Workspace) -> bytes:
    return b"".join(p.read_bytes() for p in Path(ws.path).glob("receipts.db*"))


def test_the_api_key_quoted_in_a_batch_result_is_masked(ws: Workspace, fake: FakeBatches) -> None:
    fake.error_once["u1"] = ("invalid_request_error", f"request made with key {KEY} is invalid")
    sent = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
    assert sent.exit_code == 3, sent.output
    outputs = [sent.output, ws.invoke("status", "--json").output,
               ws.invoke("report", "--format", "csv").output]  # fmt: skip
    assert "invalid_request_error" in outputs[1]  # the row failed with the API's message
    assert [text for text in outputs if KEY in text] == []
    assert KEY.encode() not in stored_bytes(ws)
