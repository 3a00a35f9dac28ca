"""`send --dry-run` opens the database read-only, so on a database from before m016 (the
first command after an upgrade, as an operator checks a file) there is no items_content and
the INDEXED BY hint drops out. The lookup of a row without an id among the earlier items
with ids must still not read every item of its channel once per staged row: 50,000 rows
without ids against 50,000 earlier items with ids took over 120 s there (1.3 s with the
index), for a comparison that is linear with it. (SQLite: its plan can be read.)"""

from __future__ import annotations

import pytest

from notifier.store import Store
from notifier.store.stage import PlanStage
from notifier.store.statements import history

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)


def test_a_read_only_comparison_without_the_content_index_is_not_quadratic(
    ws: Workspace,
) -> None:
    ws.load_fixture("m016-delivered-with-ids")
    store = Store.open(ws.db, readonly=True)
    try:
        assert "items_content" not in {
            name for (name,) in store.engine.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index'"
            )
        }  # fmt: skip
        stage = PlanStage()
        try:
            table = store.engine.stage_table(stage)
            plan = store.engine.execute("EXPLAIN QUERY PLAN " + history.verdicts_by_run(table))
            steps = [str(row[-1]) for row in plan]
        finally:
            store.engine.release_stage()
            stage.close()
    finally:
        store.close()
    # One search of items per staged row by channel alone (or a scan per row) reads every
    # item of the channel for each row: quadratic.
    per_row_scans = [
        step
        for step in steps
        if step in ("SCAN named", "SEARCH named USING INDEX items_identity (channel=?)")
    ]
    assert not per_row_scans, steps
