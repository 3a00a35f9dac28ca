"""A text cell of the SQLite file that is no longer UTF-8 (a bad disk, or a hand edit of the
file) is named for what it is: the column, the database damaged, nothing changed, and
`verify` to name every change, exit 4 (refused for safety). Never an internal error (exit
1), and never a failed write whose advice (`resume`) meets the same cell again. A PostgreSQL
server refuses such text when it is written, so this is SQLite's alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_send

pytestmark = pytest.mark.timeout(60)


@contextmanager
def _garbled(ws: Workspace) -> Iterator[None]:
    """A run killed after its first receipt, the recipient of its second item garbled for
    the block (mended after it, for the counters' check every test ends with)."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("batch.csv", make_rows(3))
    crash_send("after-receipt:1", db=ws.db, config=ws.path / "notifier.toml", channel="files")
    [target] = ws.query("SELECT target FROM items WHERE seq = 2")[0]
    ws.write("UPDATE items SET target = CAST(x'61ff62' AS TEXT) WHERE seq = 2")
    try:
        yield
    finally:
        ws.write("UPDATE items SET target = ? WHERE seq = 2", (target,))


@pytest.mark.parametrize(
    "command",
    [("report",), ("report", "--format", "json"), ("resume",), ("resume", "--concurrency", "8")],
)
def test_a_garbled_cell_is_named_with_verify_and_exit_4(
    ws: Workspace, command: tuple[str, ...]
) -> None:
    with _garbled(ws):
        result = ws.invoke(*command)
    assert result.exit_code == 4, result.output
    assert "internal error" not in result.output, result.output
    assert "'target'" in result.output and "not UTF-8" in result.output, result.output
    assert "notifier verify" in result.output, result.output
    assert "resume" not in result.output.split("Error:", 1)[1], result.output
