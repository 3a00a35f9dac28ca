"""A cancelled run's row left in flight by a kill, asked about while the receiver could still
commit it (a 404 then proves nothing: unknown, "asking again at T"), and proven undelivered
by a later `reconcile` once that window has passed: `status` and `report` show what is now
true of it (not delivered), never the question the finished run will not ask again, and
the error is written with the move that settles it, so `verify` still holds. Both stores:
a single process killed at the point leaves its item in flight on either."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores]


@pytest.mark.timeout(90)
def test_a_row_proven_undelivered_after_its_run_was_cancelled_shows_no_question_left(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=1, query_delay=0.5)
        )
        rows = [["id", "to", "subject", "body"]]
        rows += [[f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}"] for i in (1, 2)]
        batch = ws.write_csv("b.csv", rows)
        # Killed once u1 was claimed: in flight, its request never left.
        crash_send("after-intent:1", batch, db=ws.db, channel="hooks", run_id="r1")
        assert ws.ledger.item("u1", "r1").state == "in_flight"

        cancelled = ws.invoke("cancel", "r1", "--wait", "0")
        assert cancelled.exit_code == 3, cancelled.output
        u1 = ws.ledger.item("u1", "r1")
        assert u1.state == "unknown", cancelled.output
        assert "asking again at" in (u1.last_error or ""), u1

        past_every_window(monkeypatch)
        settled = ws.invoke("reconcile", "r1")
        assert settled.exit_code == 3, settled.output  # cancelled, u1 never sent
        assert ws.ledger.item("u1", "r1").state == "pending", settled.output

        texts = {
            "status": ws.invoke("status", "r1").output,
            "report": ws.invoke("report", "r1").output,
            "report --format csv": ws.invoke("report", "r1", "--format", "csv").output,
        }
        reported = json.loads(ws.invoke("report", "r1", "--format", "json").stdout)
        verified = ws.invoke("verify")
    assert receiver.commits == {}, "nothing was ever sent"
    [row] = [i for i in reported["items"] if i["id"] == "u1"]
    assert row["state"] == "pending"
    assert "asking again" not in (row["last_error"] or ""), row
    assert "not delivered" in (row["last_error"] or ""), row
    for name, text in texts.items():
        assert "asking again" not in text, (name, text)
    assert verified.exit_code == 0, verified.output
