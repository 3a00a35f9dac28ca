"""`runs` (the table and `--json`) never counts an item left in flight as pending: its request
may have been delivered, so it is counted apart, as `status` and every summary line count it
(records.Counts.summary). An operator reading "pending" expects the row still to go out;
this one goes out again only if `resume` finds it was never delivered. After a kill right
after a send (item 2 in flight), both stores; the counts add up to the run's total."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_send

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_runs_counts_an_item_left_in_flight_apart_from_the_pending_ones(ws: Workspace) -> None:
    ws.write_csv("batch.csv", make_rows(4))
    crash_send("after-send:2", db=ws.db)
    assert ws.ledger.states() == {"u1": "sent", "u2": "in_flight", "u3": "pending", "u4": "pending"}

    listed = ws.invoke("runs", "--json")
    assert listed.exit_code == 0, listed.output
    counts = json.loads(listed.output)["runs"][0]["counts"]
    assert counts["in_flight"] == 1 and counts["pending"] == 2 and counts["sent"] == 1
    assert sum(n for name, n in counts.items() if name != "total") == counts["total"] == 4
    assert counts == ws.status()["counts"]

    table = ws.invoke("runs", env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    header = next(line for line in table.output.splitlines() if "pending" in line)
    row = next(line for line in table.output.splitlines() if ws.ledger.run().run_id in line)
    columns = [c.strip() for c in header.split("┃")]
    cells = [c.strip() for c in row.split("│")]
    assert "in_flight" in columns, table.output
    assert cells[columns.index("in_flight")] == "1" and cells[columns.index("pending")] == "2"
