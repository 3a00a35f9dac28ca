"""A `cancel` whose own write fails (the disk under the database is full) has recorded
nothing: the run is as it was, still to be sent. The advice it prints is followed word for
word by an operator who wants the run stopped, so it must be the cancel again, never
`notifier resume`, which would send every row the operator was cancelling. SQLite (a disk
of its own for the file), after a kill -9."""

from __future__ import annotations

import re
import shlex
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_send
from ..support.disks import fill, notifier, tmpfs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(ws: Workspace) -> Iterator[Path]:
    """A 4 MiB tmpfs for the database alone (root on Linux; skipped elsewhere)."""
    yield from tmpfs(ws, "4m")


def test_a_cancel_refused_by_a_full_disk_never_advises_resuming_the_run(
    ws: Workspace, small_disk: Path
) -> None:
    """A run of 10 rows killed at its 3rd receipt (paused, 7 rows left); the disk under its
    database fills; `notifier cancel` fails to record the cancel (exit 3, the full disk
    named). With room again, every command its message suggests, run as printed (and the
    cancel again where it says to run the same command again), sends none of the 7 rows
    left, and the run ends cancelled."""
    config = ws.path / "notifier.toml"
    config.write_text(f'[channels.files]\ntype = "outbox"\ndir = "{ws.outbox}"\n')
    ws.write_csv("batch.csv", make_rows(10))
    db = small_disk / "receipts.db"
    crash_send("after-receipt:3", db=db, config=config, channel="files")
    delivered = sorted(p.name for p in ws.outbox.glob("*.json"))
    assert len(delivered) == 3
    # The log checkpointed into the file and emptied, so the next write needs new blocks.
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    filler = fill(small_disk)
    refused = notifier(db, "cancel")
    assert refused.exit_code == 3, refused.output
    assert "full" in refused.output, refused.output
    filler.unlink()
    suggested = re.findall(r"`(notifier [^`]+)`", refused.output)
    for command in suggested:
        notifier(db, *shlex.split(command)[1:])
    if "run the same command again" in refused.output:
        notifier(db, "cancel")
    assert sorted(p.name for p in ws.outbox.glob("*.json")) == delivered, (
        f"following {suggested} after a cancel sent the rows the operator cancelled"
    )
    status = notifier(db, "status", "--json")
    assert '"state": "cancelled"' in status.output, status.output
