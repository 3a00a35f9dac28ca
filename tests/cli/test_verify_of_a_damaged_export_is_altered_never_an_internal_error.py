"""An exported audit file damaged on disk (a page of one of its tables overwritten, a copy cut
short, one byte of a row's seal flipped into bytes that are not UTF-8, as a bad disk, an
interrupted copy or a careless editor leaves it) is what `verify FILE` exists to catch
(docs/guarantees.md: "it catches a damaged or truncated copy"): exit 5, the file named
altered, in text and as JSON. Never exit 1 with an internal error ("DatabaseError: database
disk image is malformed", "UnicodeEncodeError") and advice about `notifier status`, which
has nothing to do with the file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


def damage(path: Path, table: str) -> None:
    """The b-tree page header of `table`'s root page given an impossible cell count."""
    conn = sqlite3.connect(path)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,))
        root = root[0]
    finally:
        conn.close()
    data = bytearray(path.read_bytes())
    header = (root - 1) * page_size + (100 if root == 1 else 0)
    data[header + 3 : header + 5] = b"\xff\xff"
    path.write_bytes(bytes(data))


@pytest.fixture
def exported(ws: Workspace) -> Path:
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv", "--run-id", "r1").exit_code == 0
    result = ws.invoke("export", "r1", "--to", "audit.db")
    assert result.exit_code == 0, result.output
    assert ws.invoke("verify", "audit.db").exit_code == 0
    return ws.path / "audit.db"


@pytest.mark.parametrize("table", ["manifest", "items", "events"])
def test_a_damaged_page_of_an_export_is_altered_exit_5(
    ws: Workspace, exported: Path, table: str
) -> None:
    damage(exported, table)
    result = ws.invoke("verify", str(exported))
    assert result.exit_code == 5, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "audit.db" in result.output


def test_a_damaged_page_of_an_export_is_one_json_document(ws: Workspace, exported: Path) -> None:
    damage(exported, "items")
    result = ws.invoke("verify", str(exported), "--json")
    assert result.exit_code == 5, result.output
    json.loads(result.stdout)


def test_an_export_cut_short_is_altered_never_refused_as_no_audit_file(
    ws: Workspace, exported: Path
) -> None:
    """A copy of the file cut short by one page (an interrupted copy): still an SQLite file
    by its header, one an export wrote, damaged. Exit 5, not exit 2 "Give the file an export
    wrote"."""
    conn = sqlite3.connect(exported)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    data = exported.read_bytes()
    exported.write_bytes(data[: len(data) - page_size])
    result = ws.invoke("verify", str(exported))
    assert result.exit_code == 5, result.output
    assert "internal error" not in result.output
    assert "Give the file an export wrote" not in result.output


def flip_a_seal(path: Path) -> None:
    """The seal of item 2, its first byte flipped (a hex digit's byte XOR 0xff): bytes that
    are not UTF-8 in a text cell."""
    conn = sqlite3.connect(path)
    try:
        (seal,) = conn.execute("SELECT seal FROM items WHERE seq = 2").fetchone()
        broken = bytes([ord(seal[0]) ^ 0xFF]) + seal[1:].encode()
        with conn:
            conn.execute("UPDATE items SET seal = CAST(? AS TEXT) WHERE seq = 2", (broken,))
    finally:
        conn.close()


def test_verify_names_a_seal_cell_that_is_not_utf8_as_altered(
    ws: Workspace, exported: Path
) -> None:
    flip_a_seal(exported)
    result = ws.invoke("verify", str(exported))
    assert result.exit_code == 5, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "item" in result.output


def test_verify_json_of_a_seal_cell_that_is_not_utf8_is_one_json_document(
    ws: Workspace, exported: Path
) -> None:
    flip_a_seal(exported)
    result = ws.invoke("verify", str(exported), "--json")
    assert result.exit_code == 5, result.output
    assert "internal error" not in result.output
    json.loads(result.stdout)
