"""Read-only commands leave no trace, and a database that cannot be written is named with the
cause and the fix (exit 2), never an internal error, never changed; so is a --db that is a
symbolic link to a missing file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from notifier.cli import cli

from ..conftest import EXAMPLE, Workspace, make_rows
from ..support.crashed import crash_invoke

UNSHARE = shutil.which("unshare") or "unshare"
READ_ONLY_COMMANDS = [["status"], ["status", "--json"], ["report", "--format", "csv"], ["runs"]]


def sidecars(ws: Workspace) -> list[str]:
    return sorted(p.name for p in ws.path.iterdir() if p.name.startswith("receipts.db-"))


def test_read_only_commands_create_no_wal_or_shm(ws: Workspace) -> None:
    """status, report and runs open the database read-only: no -wal/-shm appear and the file
    is byte-for-byte unchanged."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    assert sidecars(ws) == []
    before = ws.db_file.read_bytes()
    for args in READ_ONLY_COMMANDS:
        result = ws.invoke(*args)
        assert result.exit_code == 0, (args, result.output)
        assert sidecars(ws) == [], args
    assert ws.db_file.read_bytes() == before


def in_read_only_mount(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with the workspace bind-mounted read-only (a private mount namespace), so
    the database and its directory are unwritable even for root."""
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    command = ["sh", "-c", script, "sh", str(ws.path), sys.executable, "-m", "notifier"]
    return subprocess.run(
        [UNSHARE, "-m", *command, "--db", str(ws.db), *args],
        cwd=ws.path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def read_only_mounts(ws: Workspace) -> None:
    if UNSHARE == "unshare":
        pytest.skip("unshare is not installed: cannot make a read-only mount")
    probe = in_read_only_mount(ws, "--version")
    if probe.returncode != 0:
        pytest.skip(f"no private read-only mount here (needs root): {probe.stderr.strip()}")


@pytest.mark.usefixtures("read_only_mounts")
def test_unwritable_database_reads_fine_and_refuses_writes_clearly(ws: Workspace) -> None:
    """On a read-only file system status still works, while send and resume exit 2 naming the
    database, the cause and the fix, and nothing is changed."""
    ws.write_csv("batch.csv", make_rows(5))
    crash_invoke(ws, "after-send:3", "send", "batch.csv")
    # A clean read first, so the killed process's log is checkpointed as an operator's
    # later commands would leave it; then the mount is made read-only.
    assert ws.invoke("report").exit_code == 0
    before = ws.db_file.read_bytes()
    status = in_read_only_mount(ws, "status")
    assert status.returncode == 0, status.stderr
    ws.write_csv("more.csv", make_rows(2, start=50))
    for args in (["resume"], ["send", "more.csv"], ["cancel"]):
        result = in_read_only_mount(ws, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "cannot be written" in result.stderr and str(ws.db) in result.stderr
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert ws.db_file.read_bytes() == before
    resumed = ws.invoke("resume")  # writable again: the run completes
    assert resumed.exit_code == 0, resumed.output
    assert ws.ledger.state_counts() == {"sent": 5}


def test_a_db_in_a_directory_that_does_not_exist_names_the_missing_directory(
    ws: Workspace,
) -> None:
    """`--db nowhere/r.db` says that `nowhere` does not exist and how to make it, not that
    it "is not writable"; exit 2, nothing created."""
    ws.write_csv("b.csv", make_rows(1))
    missing = ws.path / "nowhere"
    result = ws.invoke("send", "b.csv", "--db", str(missing / "r.db"))
    assert result.exit_code == 2, result.output
    assert f"{missing} does not exist" in result.output and "mkdir -p" in result.output
    assert "not writable" not in result.output
    assert not missing.exists()


def test_a_dangling_db_symlink_gets_a_clear_message_and_exit_2(ws: Workspace) -> None:
    """`--db` naming a symbolic link to a missing file exits 2 with one paragraph naming the
    link, its target and what to do, for a command that would create the database and for
    one that only reads it; nothing is created."""
    link = ws.path / "receipts-link.db"
    link.symlink_to(ws.path / "gone" / "receipts.db")
    batch = ws.write_csv("b.csv", make_rows(1))
    for args in (["send", str(batch)], ["status"]):
        result = CliRunner().invoke(cli, ["--db", str(link), *args], catch_exceptions=False)
        assert result.exit_code == 2, result.output
        message = result.output.strip()
        assert len(message.splitlines()) == 1, message
        assert f"{link} is a symbolic link to {ws.path / 'gone' / 'receipts.db'}" in message
        assert "does not exist" in message and "point --db" in message
        assert "FileNotFoundError" not in message and "internal error" not in message
    assert not (ws.path / "gone").exists() and link.is_symlink()
