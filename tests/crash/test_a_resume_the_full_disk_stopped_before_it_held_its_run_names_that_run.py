"""`notifier resume RUN` whose first write (taking the run's lease) meets a full disk has
recorded nothing; the advice must name RUN, as every storage failure of a run does: a plain
`notifier resume` takes the newest unfinished run, which may be another (one its operator
paused), and leaves RUN's rows unsent. SQLite, the database on a disk of its own."""

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


def test_a_resume_refused_by_the_full_disk_at_its_start_names_its_run(
    ws: Workspace, small_disk: Path
) -> None:
    """Run r1 (10 rows) killed at its 3rd receipt; then r2, newer, paused on purpose (its
    start a day away). The disk fills while another connection keeps the database's -wal
    and -shm open (so the open needs no room, the first write does): `notifier resume r1`
    exits 3 naming the full disk and `notifier resume r1`, never a plain `notifier resume`.
    With room again, the commands it suggests, as printed, deliver r1's rows, each once,
    and send none of r2's."""
    config = ws.path / "notifier.toml"
    config.write_text(f'[channels.files]\ntype = "outbox"\ndir = "{ws.outbox}"\n')
    ws.write_csv("batch.csv", make_rows(10))
    ws.write_csv("later.csv", make_rows(2, start=100))
    db = small_disk / "receipts.db"
    crash_send("after-receipt:3", db=db, config=config, channel="files", run_id="r1")
    paused = notifier(db, "send", "later.csv", "--run-id", "r2", "--channel", "files",
                      "--not-before", "2099-01-01T00:00:00Z", "--max-wait", "1")  # fmt: skip
    assert paused.exit_code == 3, paused.output
    assert len(list(ws.outbox.glob("*.json"))) == 3
    holder = sqlite3.connect(db)
    try:
        holder.execute("SELECT COUNT(*) FROM runs").fetchall()
        holder.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        filler = fill(small_disk)
        refused = notifier(db, "resume", "r1")
    finally:
        holder.close()
    filler.unlink()
    said = refused.stderr
    assert refused.exit_code == 3, refused.output
    assert "the disk holding receipts.db is full" in said, said
    assert "Traceback" not in said and "internal error" not in said
    assert "`notifier resume r1`" in said, said
    assert "`notifier resume`" not in said, said

    for command in re.findall(r"`(notifier [^`]+)`", said):
        notifier(db, *shlex.split(command)[1:])
    documents = [p.read_text() for p in ws.outbox.glob("*.json")]
    assert len(documents) == 10, len(documents)
    assert not any('"u100"' in d or '"u101"' in d for d in documents)
    status = notifier(db, "status", "r1", "--json")
    assert '"state": "completed"' in status.stdout, status.stdout
