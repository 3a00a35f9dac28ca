"""A bad disk flips a bit inside one event's text in the database, leaving bytes that are
not UTF-8 (SQLite's own integrity check still says "ok": the page is sound, the cell is
not). That is the accident `verify` says it catches ("a lost write, truncation, a bad
disk"): `verify RUN` exits 5 naming the event, never exit 1 with "internal error:
UnicodeEncodeError" and an "Exception ignored ... Traceback" on stderr."""

from __future__ import annotations

import json
import sqlite3

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def garbled(ws: Workspace) -> str:
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv", "--run-id", "r1").exit_code == 0
    assert ws.invoke("verify", "r1").exit_code == 0
    conn = sqlite3.connect(ws.db_file)
    try:
        seq_no, detail = conn.execute(
            "SELECT seq_no, detail FROM events WHERE run_id = 'r1' AND detail IS NOT NULL "
            "ORDER BY seq_no LIMIT 1"
        ).fetchone()
        raw = bytearray(detail.encode())
        raw[len(raw) // 2] ^= 0xFF  # one byte flipped: no longer UTF-8
        with conn:
            conn.execute(
                "UPDATE events SET detail = CAST(? AS TEXT) WHERE run_id = 'r1' AND seq_no = ?",
                (bytes(raw), seq_no),
            )
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    return "r1"


def test_verify_names_a_garbled_event_as_altered(ws: Workspace, garbled: str) -> None:
    result = ws.run("verify", garbled)
    assert result.returncode == 5, result.stdout + result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert "altered" in result.stdout


def test_verify_json_of_a_garbled_event_is_one_json_document(ws: Workspace, garbled: str) -> None:
    result = ws.run("verify", garbled, "--json")
    assert result.returncode == 5, result.stdout + result.stderr
    json.loads(result.stdout)
