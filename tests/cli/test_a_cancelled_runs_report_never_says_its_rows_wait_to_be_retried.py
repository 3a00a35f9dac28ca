"""A cancelled run sends nothing more: its report (`cancel --report`, `status`, `report`) must
never say that a row of it waits to be retried. Each pending row is said to be left unsent by
the run (sending the file again plans it: DESIGN.md section 8); here a row attempted and
marked not sent by an operator. The JSON keeps the contract's kinds (`retry_waiting`:
attempted, not delivered). Both stores."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace
from ..support.one_unknown import a_run_with_u2_unknown
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


def test_the_pending_rows_of_a_cancelled_run_are_reported_left_unsent_never_waiting(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    with a_run_with_u2_unknown(ws) as receiver:
        past_every_window(monkeypatch)
        marked = ws.invoke("reconcile", "--manual", "r1", "--item", "u2", "--mark", "not-sent",
                           "--evidence", "not in the receiver's log")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        before = ws.invoke("status", "r1").output
        # Before the cancel the run still retries it, and says so (the guard below is not
        # a wording that no report ever used).
        assert "waiting to retry" in before, before
        cancelled = ws.invoke("cancel", "r1", "--report")
        assert cancelled.exit_code in (0, 3), cancelled.output  # 3: a row left unsent
        texts = {
            "cancel --report": cancelled.output,
            "status": ws.invoke("status", "r1").output,
            "report": ws.invoke("report", "r1").output,
        }
        reported = json.loads(ws.invoke("report", "r1", "--format", "json").stdout)
        # Followed as the report says: the file sent again delivers u2, once.
        again = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "r2")
        assert again.exit_code == 0, again.output
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}
    assert {i["id"]: i["state"] for i in reported["items"]} == {
        "u1": "sent", "u2": "pending", "u3": "sent"
    }  # fmt: skip
    assert reported["pending_detail"]["retry_waiting"] == 1, reported["pending_detail"]
    for name, text in texts.items():
        assert "waiting to retry" not in text, (name, text)
        assert "retry_waiting" not in text, (name, text)
        assert "1 attempted and not delivered" in text, (name, text)
        assert "none of them is sent by this run" in text, (name, text)
        assert "pending (attempted, left unsent)" in text, (name, text)
