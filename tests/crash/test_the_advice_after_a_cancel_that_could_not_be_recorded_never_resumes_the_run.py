"""A `cancel` whose own write fails (the disk under the database is full) has recorded
nothing: the run is as it was, still to be sent. The advice it prints is followed word for
word by an operator who wants the run stopped, so it must be the cancel again, never
`notifier resume`, which would send every row the operator was cancelling."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from notifier.cli import cli

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(ws: Workspace) -> Iterator[Path]:
    """A 4 MiB tmpfs for the database alone (root on Linux; skipped elsewhere)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    disk = ws.path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)  # noqa: S607


def _notifier(db: Path, *args: str) -> Result:
    """The CLI in-process, the database given by NOTIFIER_DB as an operator's shell gives it."""
    return CliRunner().invoke(cli, list(args), env={"NOTIFIER_DB": str(db)}, catch_exceptions=False)


def _fill(disk: Path) -> None:
    """Every block of `disk` taken by a file of zeros."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_cancel_refused_by_a_full_disk_never_advises_resuming_the_run(
    ws: Workspace, small_disk: Path
) -> None:
    """A run of 10 rows killed (kill -9 at its 3rd receipt: paused, 7 rows left); the disk
    under its database fills; `notifier cancel` fails to record the cancel (exit 3, the full
    disk named). With room again, the command its message suggests, run as printed, must not
    send any of the 7 rows left: the operator asked for the run to be cancelled."""
    outbox = ws.path / "outbox"
    (ws.path / "notifier.toml").write_text(f'[channels.files]\ntype = "outbox"\ndir = "{outbox}"\n')
    ws.write_csv("batch.csv", make_rows(10))
    db = small_disk / "receipts.db"
    killed = subprocess.run(
        [sys.executable, "-m", "notifier", "send", "batch.csv", "--channel", "files"],
        cwd=ws.path,
        env={**os.environ, "NOTIFIER_DB": str(db), "NOTIFIER_CRASH_AT": "after-receipt:3"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == 137, killed.stderr
    delivered = sorted(p.name for p in outbox.glob("*.json"))
    assert len(delivered) == 3

    # The log checkpointed into the file and emptied, so the next write needs new blocks.
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _fill(small_disk)
    refused = _notifier(db, "cancel")
    assert refused.exit_code == 3, refused.output
    assert "full" in refused.output, refused.output
    (small_disk / "filler").unlink()

    # Every command the message suggests, followed word for word; and the cancel itself
    # again where the message says to run the same command again.
    suggested = re.findall(r"`(notifier [^`]+)`", refused.output)
    for command in suggested:
        _notifier(db, *shlex.split(command)[1:])
    if "run the same command again" in refused.output:
        _notifier(db, "cancel")
    assert sorted(p.name for p in outbox.glob("*.json")) == delivered, (
        f"following {suggested} after a cancel sent the rows the operator cancelled"
    )
    status = _notifier(db, "status", "--json")
    assert '"state": "cancelled"' in status.output, status.output
