"""Two send processes started at once on one file: one plans and delivers, each key once."""

from __future__ import annotations

import shutil

import pytest

from notifier.store import Store

from ..conftest import Workspace, make_rows


@pytest.mark.both_stores
@pytest.mark.timeout(100)
@pytest.mark.parametrize("database", ["exists", "not-yet"])
def test_two_simultaneous_send_processes_plan_and_deliver_once(
    ws: Workspace, database: str
) -> None:
    """Two real `notifier send` processes of the same batch into one database (already there,
    or created by whichever comes first), a few trials: exactly one run is planned, N
    deliveries; the loser exits 2 naming the winner (its rows are open there), or 0 with
    nothing to send once the winner has delivered them. (The plan lock itself is pinned
    deterministically by test_two_plans_racing_to_insert_make_exactly_one_run.)"""
    n = 30
    ws.write_csv("batch.csv", make_rows(n))
    for trial in range(4):
        ws.reset()
        shutil.rmtree(ws.outbox, ignore_errors=True)
        if database == "exists":  # as after any earlier send: the race is on the plan
            Store.open(ws.db, create=True).close()
        procs = [ws.popen("send", "batch.csv") for _ in range(2)]
        outputs = [p.communicate(timeout=120) for p in procs]
        results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
        codes = sorted(code for code, _out, _err in results)
        # The loser finds the winner's rows open (exit 2), or, when the winner had finished
        # first, delivered: nothing to send (exit 0). Either way one run and N deliveries.
        assert codes in ([0, 2], [0, 0]), (trial, results)
        run_id = ws.ledger.run().run_id
        loser = [r for r in results if r[0] == 2 or "nothing to send" in r[1]]
        assert len(loser) == 1, (trial, results)
        [(code, out, err)] = loser
        if code == 2:  # the winner's rows are open: being sent right now, or not yet
            assert (
                f"are being sent right now by run {run_id}" in err
                or f"still open (pending, in flight or unknown) in unfinished run {run_id}" in err
            ), err
        else:
            assert f"already delivered with the same content by run {run_id}" in out
        assert len(ws.outbox_documents()) == n
        assert ws.ledger.receipt_count() == n
