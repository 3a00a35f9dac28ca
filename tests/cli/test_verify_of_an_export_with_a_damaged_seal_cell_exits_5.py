"""An exported audit file with one byte of a row's seal damaged on disk (a flipped bit turning
the cell into bytes that are not UTF-8, as a bad disk or a careless editor leaves it) is
altered: `verify FILE` exits 5 naming the row, in text and as JSON. Never exit 1 with an
"internal error: UnicodeEncodeError" that tells the auditor nothing about the file."""

from __future__ import annotations

import json
import sqlite3

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def damaged(ws: Workspace) -> str:
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv", "--run-id", "r1").exit_code == 0
    exported = ws.invoke("export", "r1", "--to", "audit.db")
    assert exported.exit_code == 0, exported.output
    assert ws.invoke("verify", "audit.db").exit_code == 0
    conn = sqlite3.connect(ws.path / "audit.db")
    try:
        # The seal of item 2, its first byte flipped (a hex digit's byte XOR 0xff): bytes that
        # are not UTF-8 in a text cell.
        (seal,) = conn.execute("SELECT seal FROM items WHERE seq = 2").fetchone()
        broken = bytes([ord(seal[0]) ^ 0xFF]) + seal[1:].encode()
        with conn:
            conn.execute("UPDATE items SET seal = CAST(? AS TEXT) WHERE seq = 2", (broken,))
    finally:
        conn.close()
    return "audit.db"


def test_verify_names_a_seal_cell_that_is_not_utf8_as_altered(ws: Workspace, damaged: str) -> None:
    result = ws.invoke("verify", damaged)
    assert result.exit_code == 5, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "item" in result.output


def test_verify_json_of_a_seal_cell_that_is_not_utf8_is_one_json_document(
    ws: Workspace, damaged: str
) -> None:
    result = ws.invoke("verify", damaged, "--json")
    assert result.exit_code == 5, result.output
    assert "internal error" not in result.output
    json.loads(result.stdout)
