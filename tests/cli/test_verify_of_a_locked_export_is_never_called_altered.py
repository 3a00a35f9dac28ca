"""`verify FILE` names a file SQLite finds damaged as altered (exit 5), but an export that another
process holds locked (the export still writing it, a backup tool, an sqlite3 shell inside
BEGIN EXCLUSIVE) is "database is locked" after the connection's busy timeout: that says
nothing about its bytes, so it is exit 2, "cannot be read now", never altered.
docs/guarantees.md: exit 5 means the file is not what the export wrote."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows


@pytest.mark.timeout(60)
def test_an_untouched_export_held_locked_is_never_called_altered(
    ws: Workspace, tmp_path: Path
) -> None:
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv", "--run-id", "r1").exit_code == 0
    result = ws.invoke("export", "r1", "--to", "audit.db")
    assert result.exit_code == 0, result.output
    assert ws.invoke("verify", "audit.db").exit_code == 0
    before = (ws.path / "audit.db").read_bytes()
    holder = sqlite3.connect(ws.path / "audit.db", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        verified = ws.invoke("verify", "audit.db")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (ws.path / "audit.db").read_bytes() == before  # nothing changed the file
    assert verified.exit_code != 5, verified.output
