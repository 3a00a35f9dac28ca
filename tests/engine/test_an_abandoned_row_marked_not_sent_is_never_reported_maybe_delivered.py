"""An item an operator abandoned (`--mark abandon`: failed, maybe delivered) and then marked
not sent (`--mark not-sent`: known never delivered) is planned again by the next send of its
file. From the mark on, every report of its run says so: never "maybe delivered" beside a row
the tool is about to send again. The run still verifies (its events replay the new last
error), and the recipient gets the row once. Both stores."""

from __future__ import annotations

import csv
import io
import json

import pytest

from ..conftest import Workspace
from ..support.one_unknown import a_run_with_u2_unknown
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


def test_an_abandoned_row_marked_not_sent_is_reported_not_delivered_and_sent_once(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    with a_run_with_u2_unknown(ws) as receiver:
        past_every_window(monkeypatch)
        for mark, evidence in (("abandon", "nobody can tell"), ("not-sent", "bounce came back")):
            decided = ws.invoke("reconcile", "--manual", "r1", "--item", "u2", "--mark", mark,
                                "--evidence", evidence)  # fmt: skip
            assert decided.exit_code in (0, 3), decided.output
        assert ws.ledger.item("u2", "r1").state == "failed"
        reported = json.loads(ws.invoke("report", "r1", "--format", "json").stdout)
        listed = ws.invoke("report", "r1", "--format", "csv").stdout
        table = ws.invoke("report", "r1").output
        errors = [
            next(i for i in reported["items"] if i["id"] == "u2")["last_error"],
            {row["id"]: row for row in csv.DictReader(io.StringIO(listed))}["u2"]["last_error"],
        ]
        for error in errors:
            assert error.startswith("marked not sent by "), errors
            assert error.endswith(": bounce came back"), errors
        assert "abandoned by" not in table and "maybe delivered:" not in table, table
        assert "marked not sent by " in table, table
        assert ws.invoke("verify").exit_code == 0
        # Followed as it says: the file sent again delivers u2, once.
        again = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "r2")
        assert again.exit_code == 0, again.output
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}
