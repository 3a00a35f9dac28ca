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

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


def test_an_abandoned_row_marked_not_sent_is_reported_not_delivered_and_sent_once(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # u2: a 500 from a receiver that can neither be asked nor dedupes, nothing committed.
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("batch.csv", make_rows(3))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
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
