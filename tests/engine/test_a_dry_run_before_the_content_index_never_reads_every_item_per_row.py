"""`send --dry-run` opens the database read-only, so on a database from before m016 (the
first command after an upgrade, as an operator checks a file) there is no items_content to
find the earlier items with ids by content. The comparison then leaves that lookup out (as it
reads every row of a database from before m006 as new, until the next send migrates it),
rather than read every item of the row's channel once per staged row: 50,000 rows without
ids against 50,000 earlier items with ids took over 120 s that way (1.3 s with the index).
(SQLite: its plan can be read.)"""

from __future__ import annotations

import pytest

from notifier.store import Store
from notifier.store.stage import PlanStage

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)


def _plans_of_the_comparison(store: Store) -> list[str]:
    """SQLite's plan (EXPLAIN QUERY PLAN) of each statement the store's comparison of a plan
    with the earlier runs issues, read while its stage is still attached."""
    seen: list[str] = []
    stage = PlanStage()
    conn = store.engine.conn  # type: ignore[attr-defined]
    try:
        table = store.engine.stage_table(stage)
        conn.set_trace_callback(seen.append)
        try:
            store.history.compare(table, 0)
        finally:
            conn.set_trace_callback(None)
        return [
            str(row[-1])
            for sql in seen
            if sql.lstrip().upper().startswith("SELECT")
            for row in conn.execute("EXPLAIN QUERY PLAN " + sql)
        ]
    finally:
        store.engine.release_stage()
        stage.close()


def test_a_read_only_comparison_without_the_content_index_is_not_quadratic(
    ws: Workspace,
) -> None:
    ws.load_fixture("m016-delivered-with-ids")
    store = Store.open(ws.db, readonly=True)
    try:
        assert not store.engine.has_index("items_content")
        steps = _plans_of_the_comparison(store)
    finally:
        store.close()
    assert steps  # the comparison was read
    # A search of items per staged row by channel alone (or a scan per row) reads every item
    # of the channel for each row: quadratic.
    assert not [step for step in steps if " named" in step], steps


def test_once_migrated_the_comparison_finds_rows_with_ids_through_the_index(
    ws: Workspace,
) -> None:
    """The same comparison after a read-write open has applied m016: rows without an id are
    looked up among the earlier items with ids, through items_content (and by the row
    digest they kept, through items_row_digest)."""
    ws.load_fixture("m016-delivered-with-ids")
    Store.open(ws.db).close()
    store = Store.open(ws.db, readonly=True)
    try:
        steps = _plans_of_the_comparison(store)
    finally:
        store.close()
    named = [step for step in steps if " named" in step]
    assert any("items_content" in step for step in named), steps
    assert all("items_content" in step or "items_row_digest" in step for step in named), steps
