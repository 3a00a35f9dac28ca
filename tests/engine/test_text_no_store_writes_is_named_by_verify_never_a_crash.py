"""A value no notifier writes (text that is not UTF-8, put there with SQLite's CAST) in an
item's id or idempotency key in the database, or in an item's cell of an export, is named by
`verify` (exit 5), as text and as --json, never an internal error (exit 1): the key is read
for the run's identities digest. Output as an operator's UTF-8 terminal encodes it (strict).
SQLite only: PostgreSQL refuses text that is not UTF-8."""

from __future__ import annotations

import sqlite3

import pytest

from notifier.domain.chain import KEY_ENV

from ..conftest import Workspace, make_rows
from ..support.audited import KEY

pytestmark = pytest.mark.timeout(120)
ENV = {KEY_ENV: KEY, "PYTHONIOENCODING": "utf-8:strict"}
NOT_UTF8 = "CAST(X'ff41' AS TEXT)"  # the byte 0xff then 'A': no UTF-8 text


@pytest.fixture
def sent(ws: Workspace) -> Workspace:
    ws.write_csv("b.csv", make_rows(4))
    assert ws.invoke("send", "b.csv", "--run-id", "r1", env=ENV).exit_code == 0
    return ws


def _named(ws: Workspace, target: str) -> None:
    for extra in ((), ("--json",)):
        result = ws.run("verify", target, *extra, env=ENV)
        assert "internal error" not in result.stderr, result.stderr
        assert result.returncode == 5, result.stdout + result.stderr


@pytest.mark.parametrize("column", ["idempotency_key", "item_id"])
def test_an_id_or_key_rewritten_as_text_that_is_not_utf8_is_named_in_the_database(
    sent: Workspace, column: str
) -> None:
    ((was,),) = sent.query(f"SELECT {column} FROM items WHERE run_id = 'r1' AND seq = 2")
    sent.write(f"UPDATE items SET {column} = {NOT_UTF8} WHERE run_id = 'r1' AND seq = 2")
    try:
        _named(sent, "r1")
    finally:  # the workspace's own teardown reads every item
        sent.write(f"UPDATE items SET {column} = ? WHERE run_id = 'r1' AND seq = 2", (was,))


@pytest.mark.parametrize("column", ["idempotency_key", "item_id", "recipient", "state"])
def test_a_cell_of_an_export_rewritten_as_text_that_is_not_utf8_is_named(
    sent: Workspace, column: str
) -> None:
    exported = sent.run("export", "r1", "--to", "audit.db", env=ENV)
    assert exported.returncode == 0, exported.stderr
    with sqlite3.connect(sent.path / "audit.db") as conn:
        conn.execute(f"UPDATE items SET {column} = {NOT_UTF8} WHERE seq = 3")
    _named(sent, "audit.db")
