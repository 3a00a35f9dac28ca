"""A worker's connection to PostgreSQL ended under it (an administrator's
pg_terminate_backend, a failover, a network cut the server noticed) while it sends: whatever
statement meets the loss, a write or one of its reads of the run (the committer reads the
run's flags at every turn), the worker stops as a storage failure, exit 3, naming the
connection and the resume, never as an internal error; `resume` then settles what it left
in flight by query and sends every item once. Real processes against a real server."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from ..conftest import make_rows, wait_for
from ..engine.test_every_concurrency import CONCURRENCY, _states
from ..receiver import Receiver
from ..support.shared_runs import shared_run

# The heartbeat's renewal: its session is left alone, so that only the committer meets the loss.
_HEARTBEAT = "UPDATE workers SET heartbeat_at"


def _end_committer_sessions(server: str, pid: int) -> int:
    """End the sessions of process `pid` (named `notifier[PID]`) but its heartbeat's; how many."""
    with psycopg.connect(server, autocommit=True) as pg:
        rows = pg.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s",
            (f"notifier[{pid}]",),
        ).fetchall()
        ended = 0
        for backend, query in rows:
            if not str(query).startswith(_HEARTBEAT) and not str(query).startswith("SET "):
                pg.execute("SELECT pg_terminate_backend(%s)", (backend,))
                ended += 1
        return ended


@CONCURRENCY
@pytest.mark.timeout(120)
def test_a_worker_whose_database_session_ends_exits_3_and_resume_sends_each_item_once(
    tmp_path: Path, postgres_server: str, n: int
) -> None:
    """A `send` on PostgreSQL (N = 1 and 8) whose requests the receiver holds, so that its
    committer, its items claimed, only reads the run while it waits (at N = 8; at N = 1 it
    waits in the request): its session is ended. It exits 3 saying the database could not
    be reached and to resume, with no internal error and no traceback; `resume` then
    completes the run, each item delivered once."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    # Its requests, held by the receiver, time out only well after the committer's next
    # read of the run (every 0.2 s at most at N = 8): that read meets the loss.
    with shared_run(
        tmp_path, postgres_server, receiver, idempotent=False, status=True, timeout=5
    ) as ws:
        ws.write_csv("batch.csv", make_rows(40))
        process = ws.popen("send", "batch.csv", "--channel", "hooks", "--run-id", "cut",
                           "--concurrency", str(n))  # fmt: skip
        try:
            # Every sender holds a request at the receiver: the claims are committed, and
            # the committer waits for answers, reading the run's flags at each turn.
            receiver.wait_for(lambda r: len(r.arrivals) == n)
            wait_for(lambda: _end_committer_sessions(postgres_server, process.pid) > 0,
                     "the worker's committer session ended")  # fmt: skip
            wait_for(lambda: process.poll() is not None, "the worker stopping", timeout=30)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
            out, err = process.communicate()
        assert process.returncode == 3, out + err
        assert "internal error" not in out + err, out + err
        assert "Traceback" not in err, err
        assert "notifier resume" in out + err, out + err
        receiver.wait_for(lambda r: len(r.commits) == n)  # the requests it held, answered
        resumed = ws.invoke("resume", "cut", "--concurrency", str(n))
        assert resumed.exit_code == 0, resumed.output
        assert _states(ws) == {"sent": 40}
        assert sorted(receiver.commits.values()) == [1] * 40, receiver.commits
