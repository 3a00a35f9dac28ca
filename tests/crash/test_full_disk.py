"""A disk that fills mid-run is a clean stop, never an internal error: the message names the
disk and the next step, nothing recorded is lost, and once space is back `resume` completes
the batch with every key committed exactly once."""

from __future__ import annotations

import csv
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke
from ..support.disks import fill, notifier, tmpfs


@pytest.fixture
def small_disk(ws: Workspace) -> Iterator[Path]:
    """A 2.4 MB tmpfs for the database alone (root on Linux; skipped elsewhere): room for
    the plan of 1000 rows while its write-ahead log is checkpointed into the file (about
    twice the plan), far from room for the whole run."""
    yield from tmpfs(ws, "2400k")


@pytest.fixture
def tiny_disk(ws: Workspace) -> Iterator[Path]:
    """A 256 KiB tmpfs: room for a new database's write-ahead log, not for the log and
    the file it is checkpointed into (root on Linux; skipped elsewhere)."""
    yield from tmpfs(ws, "256k")


def test_a_disk_that_fills_mid_run_stops_cleanly_and_resumes_exactly_once(
    ws: Workspace, small_disk: Path
) -> None:
    """1000 items, the disk under the database fills after planning: exit 3 naming the full
    disk and `notifier resume`, no traceback, status still reads the run; after the disk
    grows, resume completes and the sandbox committed every key exactly once."""
    with (ws.path / "batch.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "to", "subject", "body"])
        for i in range(1, 1001):
            writer.writerow([f"u{i}", f"u{i}@example.com", "Subject " * 3, "Body text " * 20])
    db = small_disk / "receipts.db"
    with Sandbox() as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            f'status_url = "{sandbox.url}/notifications/{{key}}"\nidempotent = true\n'
        )
        stopped = notifier(db, "send", "batch.csv", "--channel", "hooks")
        assert stopped.exit_code == 3, stopped.output
        assert "the disk holding receipts.db is full" in stopped.stderr
        assert "notifier resume" in stopped.stderr
        assert "Traceback" not in stopped.stderr and "internal error" not in stopped.stderr
        status = notifier(db, "status", "--json")
        assert status.exit_code == 0, status.output
        assert '"state": "paused"' in status.stdout
        committed_before = sandbox.stats()["totals"]["commits"]
        assert 0 < committed_before < 1000  # it really stopped mid-run

        grown = subprocess.run(
            ["mount", "-o", "remount,size=64m", str(small_disk)],  # noqa: S607
            capture_output=True,
            text=True,
            check=False,
        )
        assert grown.returncode == 0, grown.stderr
        resumed = notifier(db, "resume")
        assert resumed.exit_code == 0, resumed.output
        stats = sandbox.stats()
    assert stats["totals"]["commits"] == 1000
    assert all(entry["commits"] == 1 for entry in stats["keys"].values())
    done = notifier(db, "status", "--json")
    assert '"sent": 1000' in done.stdout


def test_a_database_locked_past_the_busy_timeout_is_named_not_internal(ws: Workspace) -> None:
    """Another program holding the write lock longer than the 10 s busy timeout: `resume`
    exits 3 saying the file is locked and what to do, changes nothing, and works once the
    lock is gone."""
    ws.write_csv("batch.csv", make_rows(5))
    crash_invoke(ws, "after-intent:3", "send", "batch.csv")
    holder = sqlite3.connect(ws.db_file, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        locked = ws.invoke("resume")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert locked.exit_code == 3, locked.output
    assert "locked by another program" in locked.stderr and "run the command again" in locked.stderr
    assert "internal error" not in locked.stderr and "Traceback" not in locked.stderr
    assert ws.ledger.state_counts() == {"in_flight": 1, "pending": 2, "sent": 2}
    assert ws.invoke("resume").exit_code == 0


def test_a_new_database_on_a_full_disk_is_not_left_half_made(
    ws: Workspace, tiny_disk: Path
) -> None:
    """The first send, onto a disk with room for the new database's log but not for the file
    it is checkpointed into: exit 3 naming the full disk, no file left at the path (a short
    one would be refused by every later command as truncated), and once there is room the
    same command plans and sends."""
    ws.write_csv("batch.csv", make_rows(3))
    db = tiny_disk / "receipts.db"
    first = notifier(db, "send", "batch.csv")
    assert first.exit_code == 3, first.output
    assert "full" in first.output and "Traceback" not in first.output
    assert sorted(p.name for p in tiny_disk.iterdir()) == []
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_disk)], check=True)  # noqa: S607
    again = notifier(db, "send", "batch.csv")
    assert again.exit_code == 0, again.output


def test_an_export_onto_a_full_disk_is_named_and_leaves_no_file(
    ws: Workspace, tiny_disk: Path
) -> None:
    """An export whose file fills its disk mid-way: exit 3 naming the full disk, no file (and
    no partial one) left on it, the database read from untouched; another path works."""
    ws.write_csv("batch.csv", make_rows(1500))
    assert ws.invoke("send", "batch.csv").exit_code == 0
    full = ws.invoke("export", "--to", str(tiny_disk / "audit.db"), "--with-bodies")
    assert full.exit_code == 3, full.output
    assert "full" in full.output and "Traceback" not in full.output
    assert list(tiny_disk.iterdir()) == []
    assert ws.invoke("export", "--to", str(ws.path / "audit.db")).exit_code == 0


@pytest.mark.timeout(120)
def test_a_database_on_a_disk_another_program_filled_is_named_never_an_internal_error(
    ws: Workspace, small_disk: Path
) -> None:
    """A run left unfinished, then the disk filled by another program while no command had
    the file open (no -wal or -shm beside it): each command opening it to write needs room
    for those, and exits 3 naming the full disk and to run it again, never 1 with an
    internal error, nor a refusal of the healthy file; so does a read after them. With room
    again the same command does what it was asked."""
    ws.write_csv("batch.csv", make_rows(5))
    ws.write_csv("other.csv", make_rows(3, start=100))
    db = small_disk / "receipts.db"
    planned = notifier(db, "send", "batch.csv", "--require-approval")
    assert planned.exit_code == 0, planned.output
    assert sorted(p.name for p in small_disk.iterdir()) == ["receipts.db"]
    filler = fill(small_disk)

    for args in (("cancel",), ("resume",), ("send", "other.csv")):
        full = notifier(db, *args)
        assert full.exit_code == 3, (args, full.output)
        assert "the disk holding receipts.db is full" in full.stderr, (args, full.stderr)
        assert "run the command again" in full.stderr, (args, full.stderr)
        assert "internal error" not in full.stderr and "Traceback" not in full.stderr
    read = notifier(db, "status")
    assert read.exit_code in (0, 3), read.output
    assert "internal error" not in read.stderr and "Traceback" not in read.stderr

    filler.unlink()
    assert '"state": "awaiting_approval"' in notifier(db, "status", "--json").stdout
    cancelled = notifier(db, "cancel")
    assert cancelled.exit_code in (0, 3), cancelled.output
    assert '"state": "cancelled"' in notifier(db, "status", "--json").stdout
    assert notifier(db, "send", "other.csv").exit_code == 0
