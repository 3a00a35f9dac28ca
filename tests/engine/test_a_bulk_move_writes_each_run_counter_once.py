"""PostgreSQL's run counters (`run_counts`) stay linear in the items a transaction moves:
however many items one statement moves (a plan's suppressed rows), or however many
statements each move one (a run's deadline expiring its items one by one), each counter the
transaction changes is written once, at its end. A row written again and again in one
transaction is a chain of versions each later write walks: 60,000 suppressed rows took 48 s
to plan, and the time grew with the square of the rows. (SQLite writes a row in place.)"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("ws", ["postgres"], indirect=True)]
N = 300


def _counter_writes(conn: psycopg.Connection[Any]) -> int:
    """The rows of run_counts this transaction inserted or updated, once its deferred
    triggers have run."""
    conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    row = conn.execute(
        "SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables "
        "WHERE relname = 'run_counts' AND schemaname = current_schema()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _planned(ws: Workspace) -> str:
    ws.write_csv("b.csv", make_rows(N))
    planned = ws.invoke("send", "b.csv", "--require-approval")
    assert planned.exit_code == 0, planned.output
    [run] = ws.ledger.runs()
    return run.run_id


@pytest.mark.parametrize("statements", ["one", "one per item"])
def test_moving_many_items_in_one_transaction_writes_each_counter_once(
    ws: Workspace, statements: str
) -> None:
    """N pending items expired in one transaction, by one statement or by N: two counters
    written (pending down, expired up), and they equal a count of the items after COMMIT."""
    run_id = _planned(ws)
    with psycopg.connect(ws.url) as conn:
        if statements == "one":
            conn.execute(
                "UPDATE items SET state = 'expired' WHERE run_id = %s AND state = 'pending'",
                (run_id,),
            )
        else:
            for seq in range(1, N + 1):
                conn.execute(
                    "UPDATE items SET state = 'expired' WHERE run_id = %s AND seq = %s",
                    (run_id, seq),
                )
        assert _counter_writes(conn) == 2
    assert ws.ledger.state_counts(run_id) == {"expired": N}
    counted = ws.query("SELECT state, n FROM run_counts WHERE run_id = ? AND n <> 0", (run_id,))
    assert dict(counted) == {"expired": N}
