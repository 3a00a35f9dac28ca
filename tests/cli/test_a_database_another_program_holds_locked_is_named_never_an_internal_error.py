"""A command on a SQLite database that another program holds locked past the 10 s busy
timeout (an exclusive lock: `PRAGMA locking_mode = EXCLUSIVE`, a backup or repair tool)
says so, naming the file and what to do, with exit 3 as a write that meets the lock does,
never an internal error (exit 1): `verify` (its audited open), `report` (a read-only open)
and `export` alike. SQLite only: it is the file's lock."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(180)

HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode = EXCLUSIVE")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("UPDATE runs SET updated_at = updated_at")
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def locked(ws: Workspace) -> Iterator[Workspace]:
    ws.write_csv("b.csv", make_rows(2))
    assert ws.invoke("send", "b.csv", "--run-id", "r1").exit_code == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(ws.db_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield ws
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    "command",
    [("verify", "r1"), ("report", "r1"), ("export", "r1", "--to", "a.db")],
    ids=["verify", "report", "export"],
)
def test_a_locked_database_is_named_with_exit_3(
    locked: Workspace, command: tuple[str, ...]
) -> None:
    result = locked.invoke(*command)
    assert "internal error" not in result.output, result.output
    assert result.exit_code == 3, result.output
    assert "locked by another program" in result.output
