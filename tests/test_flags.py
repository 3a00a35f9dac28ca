"""The check before each send reads the run's flags without a query only while nobody has
committed since they were read: a cancel or a takeover committed by any process is seen by
the very next check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from notifier.flags import FlagReader, KnownFlags
from notifier.lease import holder_alive
from notifier.state_machine import RunTrigger
from notifier.store import Store, walwatch

NOW = "2026-11-30T00:00:00.000000+00:00"


def planned_run(db: Path) -> tuple[Store, int]:
    """A run of two items, its lease held by this test."""
    store = Store.open(db, create=True)
    store.create_run(
        {"run_id": "r1", "state": "planned", "created_at": NOW, "batch_path": "b.csv",
         "fingerprint": "sha256:x", "content_fingerprint": "sha256:c", "channel_snapshot": {},
         "options": {}, "contract_version": "v1"},
        [{"run_id": "r1", "seq": n, "item_id": str(n), "channel": "hooks",
          "target": f"{n}@x.y", "payload": {}, "idempotency_key": f"k{n}",
          "intent_digest": f"sha256:{n}"} for n in (1, 2)],
    )  # fmt: skip
    return store, store.acquire_lease("r1", {"host": "h", "pid": 1}, 30, holder_alive)


def commit_elsewhere(db: Path, sql: str) -> None:
    """One commit by another process, as `notifier cancel` or a second worker would make."""
    script = (
        "import sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA busy_timeout = 10000')\n"
        "conn.execute(sys.argv[2])\n"
        "conn.close()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(db), sql], check=True)


def test_the_commit_marker_changes_with_each_commit_and_only_then(tmp_path: Path) -> None:
    """Reads leave the marker as it was; a commit by another process or by another
    connection of this one changes it."""
    db = tmp_path / "receipts.db"
    store, version = planned_run(db)
    marker = store.watch_commits()
    assert marker is not None
    before = marker()
    store.run_flags("r1")
    store.counts("r1")
    assert marker() == before
    commit_elsewhere(db, "UPDATE runs SET stop_reason = 'x' WHERE run_id = 'r1'")
    after_other_process = marker()
    assert after_other_process != before
    other = store.secondary()
    other.move_run("r1", RunTrigger.START, version)
    assert marker() != after_other_process
    other.close()
    store.close()


def test_a_cancel_committed_by_another_process_is_seen_by_the_next_check(
    tmp_path: Path,
) -> None:
    """Between commits the flags come from memory; right after another process commits a
    cancel (or takes the lease over), the next check reads them from the database."""
    db = tmp_path / "receipts.db"
    store, version = planned_run(db)
    known = KnownFlags(store.watch_commits())
    reader = FlagReader(store.secondary(), "r1", known)
    assert known.current() is None  # nothing read yet
    assert reader.read() == (None, version)
    assert known.current() == (None, version)  # now held without a query
    commit_elsewhere(db, f"UPDATE runs SET cancel_requested_at = '{NOW}' WHERE run_id = 'r1'")
    assert known.current() is None
    assert reader.read() == (NOW, version)
    assert known.current() == (NOW, version)
    commit_elsewhere(db, "UPDATE runs SET lease_version = lease_version + 1 WHERE run_id = 'r1'")
    assert known.current() is None
    assert reader.read() == (NOW, version + 1)
    reader.store.close()
    store.close()


def test_without_a_wal_index_every_check_asks_the_database(tmp_path: Path) -> None:
    """No marker to hold the flags by (PostgreSQL has none): nothing is held in memory, each
    read asks the database."""
    db = tmp_path / "receipts.db"
    store, version = planned_run(db)
    known = KnownFlags(None)
    reader = FlagReader(store, "r1", known)
    assert reader.read() == (None, version)
    assert not known.watching
    assert known.current() is None
    commit_elsewhere(db, f"UPDATE runs SET cancel_requested_at = '{NOW}' WHERE run_id = 'r1'")
    assert reader.read() == (NOW, version)
    store.close()


def locked_by_another_process(shm: Path) -> bool:
    """Whether some process holds a lock on SQLite's lock bytes of the -shm file (120 to
    128, the last being "in use": a process that can lock it alone rebuilds the file)."""
    script = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n"
        "    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 9, 120)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", script, str(shm)], check=False).returncode == 1


def test_the_watch_never_drops_sqlites_locks(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops all this process's locks on it: the watch's
    descriptor stays open while any connection is, and goes when the last one closes."""
    db = tmp_path / "receipts.db"
    shm = tmp_path / "receipts.db-shm"
    store, _ = planned_run(db)
    assert locked_by_another_process(shm)
    fds = len(os.listdir("/proc/self/fd"))
    assert store.watch_commits() is not None
    other = store.secondary()
    assert other.watch_commits() is not None
    other.close()
    assert locked_by_another_process(shm)  # SQLite's locks are all still held
    store.close()  # the last connection: SQLite lets go of (and removes) the -shm
    assert not shm.exists() or not locked_by_another_process(shm)
    assert len(os.listdir("/proc/self/fd")) < fds  # the watch's descriptors closed too


def test_a_header_it_cannot_read_leaves_sqlites_locks_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A -shm whose header is of a version this code does not know is not watched (every
    check asks the database), and its mapping is not closed early: that would close a
    descriptor of the file and drop SQLite's locks too."""
    monkeypatch.setattr(walwatch, "_WALINDEX_VERSION", 1)
    db = tmp_path / "receipts.db"
    store, _ = planned_run(db)
    assert store.watch_commits() is None
    assert locked_by_another_process(tmp_path / "receipts.db-shm")
    store.close()


def test_a_shm_file_sqlite_does_not_hold_open_is_never_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the -shm looked for in the wrong place (a stale copy beside a link, say), its
    header would never change and a cancel would be missed: only a file this process's
    SQLite holds open is watched."""
    db = tmp_path / "receipts.db"
    stale = tmp_path / "stale-shm"
    monkeypatch.setattr(walwatch, "_shm_of", lambda database: stale)
    store, _ = planned_run(db)
    stale.write_bytes((tmp_path / "receipts.db-shm").read_bytes())  # a valid header
    assert store.watch_commits() is None
    store.close()
