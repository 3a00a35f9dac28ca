"""Migrations m016 (items with ids indexed by channel and content) and m017 (PostgreSQL's run
counters moved once per transaction) on a database written by the code before them, on both
engines: the committed fixture's run of a file with an `id` column, killed mid-send,
resumes and sends each remaining row once, its counters equal to its items (checked after
every test); the same file sent again without its `id` column is then refused (exit 2:
those rows were delivered, named otherwise), nothing sent; and the lookup reads the new
index."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from notifier.store import Store
from notifier.store.stage import PlanStage
from notifier.store.statements import history

from ..conftest import Workspace
from ..support.workspace import FIXTURES

pytestmark = pytest.mark.timeout(120)
NAME = "m016-delivered-with-ids"
RUN = "m016-with-ids"


def _without_ids(ws: Workspace) -> str:
    with (FIXTURES / f"{NAME}.csv").open(newline="", encoding="utf-8") as handle:
        rows = [row[1:] for row in csv.reader(handle)]
    ws.write_csv("no-ids.csv", rows)
    return "no-ids.csv"


@pytest.mark.both_stores
def test_the_killed_run_resumes_once_each_and_its_rows_hold_the_file_without_ids(
    ws: Workspace,
) -> None:
    """k1-k6 were sent and k7 written before the kill: resume settles k7 by asking the
    outbox and sends k8-k12, each once; the file without its `id` column is refused."""
    ws.load_fixture(NAME)
    shutil.copy(FIXTURES / f"{NAME}.csv", ws.path / "batch.csv")
    resumed = ws.invoke("resume", RUN)
    assert resumed.exit_code == 0, resumed.output
    assert {"m016_items_by_content", "m017_counts_once_per_transaction"} <= set(
        ws.ledger.migrations()
    )
    assert ws.ledger.state_counts(RUN) == {"sent": 12}
    ids = sorted(d["item_id"] for d in ws.outbox_documents())
    assert ids == sorted(f"k{i}" for i in range(1, 13))
    refused = ws.invoke("send", _without_ids(ws), "--channel", "files")
    assert refused.exit_code == 2, refused.output
    assert "12 row(s) have the channel, recipient and content" in refused.output
    assert len(ws.outbox_documents()) == 12 and len(ws.ledger.runs()) == 1
    again = ws.invoke("send", "batch.csv", "--channel", "files")
    assert again.exit_code == 0, again.output
    assert len(ws.outbox_documents()) == 12


def test_rows_without_ids_find_the_rows_with_ids_through_the_content_index(
    ws: Workspace, tmp_path: Path
) -> None:
    """(SQLite, whose plan can be read.) The comparison a plan makes looks a row without an
    id up among the earlier items with ids by channel and content through items_content
    (and by the row digest they kept, through items_row_digest), never by reading every
    item of the database."""
    ws.load_fixture(NAME)
    store = Store.open(ws.db)
    try:
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
    searched = [step for step in steps if " named " in step + " "]
    assert any("items_content" in step for step in searched), steps
    assert all("items_content" in step or "items_row_digest" in step for step in searched), steps
