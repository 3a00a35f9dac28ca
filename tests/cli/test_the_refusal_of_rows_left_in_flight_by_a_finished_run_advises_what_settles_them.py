"""A file whose rows a finished run left IN FLIGHT (the documented residual of a cancelled
shared run: a dead worker not fenced out within CANCEL_ADOPT_S leaves its items in flight
"for reconcile", docs/guarantees.md) is refused as unsettled. The refusal's advice, followed
word for word, must settle them so that the file can be sent again: `reconcile --manual`
settles only unknown items, so alone it would leave them in flight and the file refused
for good; a plain `reconcile RUN` settles in-flight items by query. The state is built
directly (a worker's claim, its lease expired, the run closed): reaching it with real
processes needs a dead worker's transaction held open past CANCEL_ADOPT_S."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

from notifier.cli import cli
from notifier.domain import clock

from ..conftest import Workspace
from ..crash.test_cancel_settles_dead_workers_items import _forge
from ..engine.test_pg_concurrent_writes import pg_url, plan, rows, worker

__all__ = ["pg_url"]


def _invoke(db: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--db", db, *args], catch_exceptions=False, input="")
    return result.exit_code, result.output


@pytest.mark.timeout(60)
def test_the_advice_of_a_refusal_over_rows_in_flight_in_a_finished_run_lets_the_file_go(
    ws: Workspace, pg_url: str
) -> None:
    plan(ws, pg_url, "k1", "batch.csv", 1)
    forge = _forge(pg_url)
    forge.run_state("k1", "running")
    dead, version = worker(pg_url, "k1", "worker-dead")
    try:
        claimed = dead.ledger.claim("k1", version, 2)  # point A of two items, never sent
    finally:
        dead.close()
    assert [i.seq for i in claimed] == [1, 2]
    # The dead worker (another host) was never fenced out; the last live worker closed the
    # cancelled run with its items still in flight.
    forge.worker_lease_expires("worker-dead", clock.iso(clock.later(-60)))
    forge.run_state("k1", "cancelled")

    code, out = _invoke(pg_url, "send", "batch.csv")
    assert code == 2, out
    assert "may have been delivered by finished run k1" in out, out
    advised = [c for c in re.findall(r"`(notifier [^`]*)`", out) if "reconcile" in c]
    assert advised, out
    # Followed word for word (the operator has nothing to decide: no item is unknown).
    words = shlex.split(advised[0])[1:]  # it repeats --db itself
    result = CliRunner().invoke(cli, words, catch_exceptions=False, input="")
    code, settled = result.exit_code, result.output
    assert code in (0, 3), settled
    in_flight = rows(pg_url, "SELECT seq FROM items WHERE run_id = 'k1' AND state = 'in_flight'")
    assert in_flight == [], f"after `{advised[0]}`:\n{settled}\nstill in flight: {in_flight}"
    code, out = _invoke(pg_url, "send", "batch.csv")
    assert code in (0, 3), f"the file is refused again after following the advice:\n{out}"
