"""`report --state` lists only the items in those states, in every format; and the messages of
name the command that will work: `reconcile --manual` for unknowns no query can
settle, and for the loser of a race the holder and what to run once it is done."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from notifier.engine.membership import HOST, process_start

from ..conftest import Inbox, Workspace, make_rows
from ..support.crashed import crash_send

pytestmark = pytest.mark.both_stores


def crashed_run(ws: Workspace, n: int, at: str, channel: str | None = None) -> str:
    """Send `n` rows and crash at `at` (NOTIFIER_CRASH_AT); returns the run id."""
    ws.write_csv("batch.csv", make_rows(n))
    crash_send(at, db=ws.db, channel=channel)
    return ws.ledger.run().run_id


def test_report_state_lists_only_those_items_in_every_format(ws: Workspace) -> None:
    """`--state` (repeatable) keeps only the items in those states in JSON, CSV and the
    table; the counts still cover the whole run."""
    crashed_run(ws, 6, "after-send:3")  # 1-2 sent, 3 in flight, 4-6 pending
    as_json = ws.invoke("report", "--format", "json", "--state", "pending")
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert [i["id"] for i in report["items"]] == ["u4", "u5", "u6"]
    assert report["counts"]["total"] == 6 and report["state_filter"] == ["pending"]
    as_csv = ws.invoke("report", "--format", "csv", "--state", "sent", "--state", "in_flight")
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(r["id"], r["state"]) for r in rows] == [
        ("u1", "sent"),
        ("u2", "sent"),
        ("u3", "in_flight"),
    ]
    table = ws.invoke("report", "--state", "sent")
    assert table.exit_code == 0, table.output
    assert "items sent" in table.stdout
    assert "user1@example.com" in table.stdout and "user2@example.com" in table.stdout
    assert "user3@example.com" not in table.stdout and "user4@example.com" not in table.stdout
    unfiltered = json.loads(ws.invoke("report", "--format", "json").stdout)
    assert len(unfiltered["items"]) == 6 and "state_filter" not in unfiltered
    assert ws.invoke("report", "--state", "bogus").exit_code == 2


def test_reconcile_points_unknowns_no_query_can_settle_to_manual(
    ws: Workspace, inbox: Inbox
) -> None:
    """SMTP cannot be asked whether a message arrived: `reconcile` says it can settle nothing
    by query and names `notifier reconcile --manual RUN`, the command that settles them."""
    run_id = crashed_run(ws, 4, "after-send:2", channel="mail")
    first = ws.invoke("reconcile")  # the in-flight item becomes unknown
    assert [i.item_id for i in ws.ledger.items() if i.state == "unknown"] == ["u2"]
    again = ws.invoke("reconcile")
    for result in (first, again):
        assert result.exit_code == 3, result.output
        assert "nothing `notifier reconcile` can settle for them by query" in result.output
        assert f"`notifier reconcile --manual {run_id}`" in result.output
        assert "nothing to settle: no item" not in result.output
    assert "channel(s) mail" in again.output


def test_the_loser_of_a_race_is_told_the_holder_and_what_to_run_after(ws: Workspace) -> None:
    """A resume that finds the run held by a live process is refused (exit 4) naming that
    process, `notifier status RUN` to follow it and `notifier resume RUN` once it is done,
    and sends nothing."""
    run_id = crashed_run(ws, 4, "after-send:2")
    sent = len(ws.outbox_documents())
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = {"host": HOST, "pid": holder.pid, "started": process_start(holder.pid)}
        ws.forge.lease_held_by({**owner, "token": "winner"}, "2999-01-01T00:00:00+00:00", run_id)
        loser = ws.invoke("resume")
    finally:
        holder.kill()
        holder.wait()
    assert loser.exit_code == 4, loser.output
    assert f"pid {holder.pid} on {HOST}" in loser.output
    assert f"`notifier status {run_id}`" in loser.output
    assert f"once it has finished or stopped, `notifier resume {run_id}`" in loser.output
    assert len(ws.outbox_documents()) == sent
