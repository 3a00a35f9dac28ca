"""A database the checks refuse is checked on a read-only connection, so not even a command
that would write (send, resume, cancel, reconcile) leaves a trace on it; and a refusal from an
`immutable` read stands only if the file did not change under the checks."""

from __future__ import annotations

import os
import sqlite3

import pytest

from notifier.store import Store, StoreRefused
from notifier.store.checks import Checks

from ..conftest import EXAMPLE, Workspace, make_rows

WRITING_COMMANDS = [["resume"], ["cancel"], ["reconcile"], ["send", "other.csv"]]


def sidecars(ws: Workspace) -> list[str]:
    return sorted(p.name for p in ws.path.iterdir() if p.name.startswith("receipts.db-"))


@pytest.mark.parametrize("args", WRITING_COMMANDS, ids=" ".join)
def test_a_refused_file_gets_no_wal_or_shm_from_a_writing_command(
    ws: Workspace, args: list[str]
) -> None:
    """A sent item without a receipt: refused (exit 4), the file's bytes and its directory
    as they were (no -wal or -shm created and left behind)."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    ws.write_csv("other.csv", make_rows(3))
    conn = sqlite3.connect(ws.db_file)
    conn.execute("DELETE FROM receipts WHERE rowid = (SELECT MIN(rowid) FROM receipts)")
    conn.commit()
    conn.close()
    assert sidecars(ws) == []
    before = ws.db_file.read_bytes()
    try:
        result = ws.invoke(*args)
        assert result.exit_code == 4, result.output
        assert "has no receipt" in result.output
        assert ws.db_file.read_bytes() == before
        assert sidecars(ws) == []
    finally:
        ws.reset()  # a contradictory file on purpose


def _refusing(first_call: list[bool], change_the_file: bool, db: os.PathLike[str]) -> object:
    original = Checks.check_invariants

    def check_invariants(self: Checks) -> None:
        first_call.append(True)
        if len(first_call) == 1:
            if change_the_file:  # another process checkpointed under our immutable reads
                stat = os.stat(db)
                os.utime(db, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
            raise StoreRefused(f"{db}: integrity check failed (a torn read)")
        original(self)

    return check_invariants


def test_a_refusal_while_the_file_changed_is_checked_again(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    calls: list[bool] = []
    monkeypatch.setattr(Checks, "check_invariants", _refusing(calls, True, ws.db_file))
    store = Store.open(ws.db)
    store.close()
    assert len(calls) == 2


def test_a_refusal_of_an_unchanged_file_stands(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    calls: list[bool] = []
    monkeypatch.setattr(Checks, "check_invariants", _refusing(calls, False, ws.db_file))
    with pytest.raises(StoreRefused, match="a torn read"):
        Store.open(ws.db)
    assert len(calls) == 1
