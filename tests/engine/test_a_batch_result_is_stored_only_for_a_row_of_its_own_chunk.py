"""A Message Batches result is a chunk's only by its custom_id, `{prefix}_{chunk}_{seq}`:
a result whose seq is not a row of that chunk, or not a number at all (a server's bad
answer), is no draft of any row. Stored, it would give one recipient the text drafted for
another; parsed blindly, it ended the command with an internal error (exit 1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeBatches, serving
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(120)
Lines = list[dict[str, Any]]


class AddsResults(FakeBatches):
    """FakeBatches whose batch `chunk` (by its custom_ids) ends with `extra` result lines
    besides its own: each made from its first line, under another custom_id suffix."""

    def __init__(self, chunk: str, suffixes: list[str]) -> None:
        super().__init__()
        self.chunk, self.suffixes = chunk, suffixes

    def _end(self, batch_id: str) -> None:
        super()._end(batch_id)
        lines: Lines = self.batches[batch_id]["results"]
        prefix, number, _ = lines[0]["custom_id"].split("_")
        if number == self.chunk:
            lines += [
                {**lines[0], "custom_id": f"{prefix}_{number}_{suffix}"} for suffix in self.suffixes
            ]


def serve(monkeypatch: pytest.MonkeyPatch, server: FakeBatches) -> Iterator[FakeBatches]:
    with serving(monkeypatch, server):
        yield server


def drafted(ws: Workspace) -> list[tuple[int, str, str]]:
    return [(d["seq"], d["state"], d["subject"]) for d in ws.ledger.drafts()]


def run(ws: Workspace, monkeypatch: pytest.MonkeyPatch, server: FakeBatches, n: int) -> None:
    for _ in serve(monkeypatch, server):
        result = ws.invoke(
            "send", str(batch(ws, n)), "--compose", str(brief(ws)), "--batch-api",
            "--require-approval",
        )  # fmt: skip
        assert result.exit_code == 0, result.output


def test_a_result_for_a_row_of_another_chunk_is_not_that_rows_draft(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk 1's batch (rows 1, 2) also answers for row 3, which chunk 2 asked for: row 3
    keeps the draft chunk 2 made for it, never the one made from user 1's row."""
    run(ws, monkeypatch, AddsResults("1", ["3"]), 4)
    assert drafted(ws) == [(i, "drafted", f"Draft u{i}") for i in range(1, 5)]


@pytest.mark.parametrize("suffix", ["x", "3-", "٣"])
def test_a_result_whose_row_is_not_a_number_of_the_chunk_is_ignored(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """A custom_id with the chunk's prefix but no row number of it after: no internal
    error, nothing stored for it, every row drafted from its own result."""
    run(ws, monkeypatch, AddsResults("1", [suffix]), 4)
    assert drafted(ws) == [(i, "drafted", f"Draft u{i}") for i in range(1, 5)]
