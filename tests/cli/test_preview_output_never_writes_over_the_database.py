"""`preview --output` pointed at the receipts database itself (a slip of the tab key:
`receipts.db` beside `preview.csv`), or at one of its sidecar files, is bad input (exit 2)
naming the database; the database, every run and receipt in it, is left as it was. Never
the file truncated and overwritten with the preview, then an "internal error" claiming
"Nothing was lost"."""

from __future__ import annotations

import os
import sqlite3

import pytest

from ..conftest import Workspace
from .test_a_file_a_command_writes_that_cannot_be_written_is_named import planned

__all__ = ["planned"]  # a run of 3 rows awaiting approval, nothing sent
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("spelling", ["receipts.db", "./receipts.db", "absolute"])
@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_preview_output_naming_the_database_is_refused_and_the_database_kept(
    planned: Workspace, spelling: str, fmt: str
) -> None:
    before = planned.db_file.read_bytes()
    output = str(planned.db_file) if spelling == "absolute" else spelling
    result = planned.invoke("preview", "--format", fmt, "--output", output)
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "receipts.db" in result.output and "database" in result.output
    # The database still opens, with its run, as it was.
    assert planned.db_file.read_bytes()[:16] == b"SQLite format 3\x00"
    assert len(planned.db_file.read_bytes()) == len(before)
    runs = planned.invoke("runs", "--json")
    assert runs.exit_code == 0, runs.output


def test_preview_output_naming_a_symlink_to_the_database_is_refused(planned: Workspace) -> None:
    os.symlink(planned.db_file, planned.path / "preview.csv")
    result = planned.invoke("preview", "--output", "preview.csv")
    assert result.exit_code == 2, result.output
    conn = sqlite3.connect(planned.db_file)
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)
    finally:
        conn.close()


def test_preview_output_naming_the_databases_write_ahead_log_is_refused(
    planned: Workspace,
) -> None:
    wal = planned.path / "receipts.db-wal"
    result = planned.invoke("preview", "--output", str(wal))
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output
