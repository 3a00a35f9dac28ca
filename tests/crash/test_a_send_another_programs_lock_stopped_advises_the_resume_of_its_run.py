"""A `send` whose write meets another program's lock on the database for longer than the
busy timeout, mid-run, stops cleanly (exit 3, no traceback, nothing recorded lost). Its
advice, followed as printed once the lock is gone, must go on with the run: `notifier
resume RUN`. "Run the command again" sends the file again, which is refused (exit 2) while
the run it planned is unfinished. Followed, every row reaches the receiver once; no item
is left in flight for a later resume to send again without asking. At concurrency 1 and 8,
on both stores: on SQLite the file's write lock (BEGIN IMMEDIATE), on PostgreSQL another
session's lock on the items (LOCK TABLE), past the 10 s lock timeout."""

from __future__ import annotations

import re
import shlex
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from ..conftest import Workspace, make_rows
from ..receiver import HoldAfter, Receiver, receiving, webhook_config

pytestmark = [pytest.mark.timeout(180), pytest.mark.both_stores]


@contextmanager
def write_locked(ws: Workspace) -> Iterator[None]:
    """Another program holding the run's writes off, until the block ends."""
    if ws.store == "sqlite":
        holder = sqlite3.connect(ws.db_file, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
        finally:
            holder.close()
        return
    with psycopg.connect(str(ws.db)) as session, session.transaction():
        session.execute("LOCK TABLE items IN SHARE MODE")  # reads go on, writes wait
        yield


ROWS = 20


@pytest.mark.parametrize("concurrency", ["1", "8"])
def test_a_send_another_programs_lock_stopped_advises_resuming_its_run(
    ws: Workspace, concurrency: str
) -> None:
    """Three rows answered, the rest held at the receiver; another program takes the write
    lock (BEGIN IMMEDIATE) and the held answers are released: the send cannot record them
    within the 10 s busy timeout and exits 3 naming the lock and `notifier resume RUN`.
    With the lock released, each suggested command, as printed, is refused by none; the
    run completes; every row was delivered exactly once."""
    hold = HoldAfter(3)
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True, timeout=30)
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        args = ("send", "batch.csv", "--channel", "hooks", "--concurrency", concurrency)
        sender = ws.popen(*args)
        receiver.wait_for(lambda r: len(r.arrivals) >= 4)
        with write_locked(ws):
            hold.set()
            _, said = sender.communicate(timeout=120)
        run_id = str(ws.status()["run_id"])
        assert sender.returncode == 3, said
        assert re.search("locked by another (program|session)", said), said
        assert "Traceback" not in said and "internal error" not in said
        assert f"`notifier resume {run_id}`" in said, said

        for command in re.findall(r"`notifier ([^`]+)`", said):
            followed = ws.invoke(*shlex.split(command))
            assert followed.exit_code in (0, 3), (command, followed.output)
        if "run the command again" in said:
            again = ws.invoke(*args)
            assert again.exit_code in (0, 3), again.output
        assert ws.ledger.state_counts(run_id) == {"sent": ROWS}
        deliveries = receiver.deliveries()
    assert sorted(deliveries) == sorted(f"u{i}" for i in range(1, ROWS + 1))
    assert set(deliveries.values()) == {1}, deliveries
