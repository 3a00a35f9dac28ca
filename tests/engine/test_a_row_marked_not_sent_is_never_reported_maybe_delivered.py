"""An operator's `--mark not-sent` says the item was not delivered, and the tool acts on it:
the run's resume, or the file sent again once the run is finished, sends it. Every report of
the run (`report` in each format, `cancel --report`) must then say so too: never keep the
text of the uncertain answer before the mark ("may have been delivered, not sent again"), a
claim the tool itself has just overruled, beside a row that is about to be sent again. Each
row reaches its recipient once. Both stores."""

from __future__ import annotations

import csv
import io
import json

import pytest

from ..conftest import Workspace
from ..support.one_unknown import a_run_with_u2_unknown
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


def test_a_row_marked_not_sent_is_reported_not_delivered_in_every_report_and_sent_once(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    with a_run_with_u2_unknown(ws) as receiver:
        past_every_window(monkeypatch)  # the operator looked at the receiver after its window
        marked = ws.invoke("reconcile", "--manual", "r1", "--item", "u2", "--mark", "not-sent",
                           "--evidence", "not in the receiver's log")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        cancelled = ws.invoke("cancel", "r1", "--report", "--format", "json")
        reported = json.loads(ws.invoke("report", "r1", "--format", "json").stdout)
        listed = ws.invoke("report", "r1", "--format", "csv").stdout
        rows = {row["id"]: row for row in csv.DictReader(io.StringIO(listed))}
        table = ws.invoke("report", "r1").output
        for u2 in (
            next(i for i in json.loads(cancelled.stdout)["items"] if i["id"] == "u2"),
            next(i for i in reported["items"] if i["id"] == "u2"),
            rows["u2"],
        ):
            assert u2["state"] == "pending", u2
            assert "may have been delivered" not in (u2["last_error"] or ""), u2
        assert "may have been delivered" not in table, table
        # Followed as it says: the file sent again delivers u2, once.
        again = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "r2")
        assert again.exit_code == 0, again.output
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}
