"""A database whose checkpoint a kill (-9) cut short, its pages still in the -wal: opened and
resumed, not refused; a damaged page beside it is refused, untouched, by quick_check."""

from __future__ import annotations

import pytest

from notifier.engine.crash import ENV as CRASH_ENV
from notifier.store import Store
from notifier.store.sqlite import SqliteEngine

from ..conftest import Workspace, make_rows
from ..engine.test_store_integrity import (
    _cut_short_checkpoint,
    _damage_an_attempts_leaf_only_the_file_holds,
    _digest,
)


def test_database_mid_checkpoint_with_wal_is_opened_not_refused(ws: Workspace) -> None:
    """A file shorter than its header because a checkpoint was cut short (kill -9, full disk)
    still has its pages in the -wal: it is opened and the run resumed, not refused."""
    rows = [["id", "to", "subject", "body"]]
    rows += [[f"u{i}", f"u{i}@example.com", "s" * 50, "b" * 500] for i in range(1, 301)]
    batch = ws.write_csv("big.csv", rows)
    crashed = ws.run("send", str(batch), env={"NOTIFIER_CRASH_AT": "after-send:250"})
    assert crashed.returncode == 137, crashed.stderr
    _cut_short_checkpoint(ws)
    status = ws.invoke("status", "--json")
    assert status.exit_code == 0, status.output
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert ws.ledger.state_counts() == {"sent": 300}
    assert len(list(ws.outbox.glob("*.json"))) == 300


@pytest.mark.timeout(60)
def test_a_damaged_page_beside_a_wal_is_refused_untouched_by_quick_check(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file cut short mid-checkpoint is opened only if SQLite's quick_check passes: a leaf
    of `attempts` damaged in the middle of the file, which no other check on open reads, is
    refused (exit 4) by every command, in one paragraph naming the file, with the file and
    its -wal byte for byte as they were."""
    assert ws.invoke("send", ws.write_csv("a.csv", make_rows(400)).name).exit_code == 0
    rows = [["id", "to", "subject", "body"]]
    rows += [[f"v{i}", f"v{i}@example.com", "s", "b" * 1500] for i in range(1, 41)]
    crashed = ws.run("send", ws.write_csv("b.csv", rows).name, env={CRASH_ENV: "after-send:30"})
    assert crashed.returncode == 137, crashed.stderr
    _cut_short_checkpoint(ws)
    ws.write_csv("other.csv", make_rows(3, start=500))
    page = _damage_an_attempts_leaf_only_the_file_holds(ws)
    wal = ws.path / "receipts.db-wal"
    try:
        # The damage is quick_check's alone to find: without it, a copy of the pair opens.
        copy = ws.path / "copy"
        copy.mkdir()
        for name in (ws.db_file.name, wal.name):
            (copy / name).write_bytes((ws.path / name).read_bytes())
        with monkeypatch.context() as unchecked:
            unchecked.setattr(SqliteEngine, "_check_pages_in_wal", lambda self, short: None)
            Store.open(copy / ws.db_file.name, readonly=True).close()
        before = (_digest(ws.db_file), _digest(wal))
        for args in (["status"], ["status", "--json"], ["resume"], ["send", "other.csv"]):
            result = ws.invoke(*args)
            said = result.output.strip()
            assert result.exit_code == 4, (args, result.output)
            assert str(ws.db_file) in said and "quick_check" in said, (args, said)
            assert f"page {page}" in said, (args, said)
            assert "\n" not in said and "Traceback" not in said, (args, said)
            assert (_digest(ws.db_file), _digest(wal)) == before, args
    finally:
        ws.reset()  # a damaged file on purpose: nothing for the counters check to read
