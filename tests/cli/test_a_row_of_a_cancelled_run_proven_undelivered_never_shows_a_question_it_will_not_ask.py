"""A cancelled run's row left in flight by a kill, asked about while the receiver could still
commit it (a 404 then proves nothing: unknown, "asking again at T"), and proven undelivered
by a later `reconcile` once that window has passed: `status` and `report` show what is now
true of it (not delivered), never the question the finished run will not ask again, and
the error is written with the move that settles it, so `verify` still holds. Both stores:
a single process crashed at the point leaves its items in flight on either; at concurrency
1, and at 8 with items claimed ahead (all of them in flight at once)."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_row_proven_undelivered_after_its_run_was_cancelled_shows_no_question_left(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=1, query_delay=60)
        )
        rows = [["id", "to", "subject", "body"]]
        rows += [[f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}"] for i in range(1, 41)]
        batch = ws.write_csv("b.csv", rows)
        # Crashed once the first items were claimed: in flight, no request ever left.
        crash_send("after-intent:1", batch, db=ws.db, channel="hooks", run_id="r1",
                   concurrency=concurrency)  # fmt: skip
        claimed = [i.item_id for i in ws.ledger.items("r1") if i.state == "in_flight"]
        assert len(claimed) >= concurrency, claimed

        cancelled = ws.invoke("cancel", "r1", "--wait", "0")
        assert cancelled.exit_code == 3, cancelled.output
        for item_id in claimed:
            item = ws.ledger.item(item_id, "r1")
            assert item.state == "unknown", (item, cancelled.output)
            assert "asking again at" in (item.last_error or ""), item

        past_every_window(monkeypatch)
        settled = ws.invoke("reconcile", "r1")
        assert settled.exit_code == 3, settled.output  # cancelled, none of them sent
        assert {ws.ledger.item(i, "r1").state for i in claimed} == {"pending"}, settled.output

        texts = {
            "status": ws.invoke("status", "r1").output,
            "report": ws.invoke("report", "r1").output,
            "report --format csv": ws.invoke("report", "r1", "--format", "csv").output,
        }
        reported = json.loads(ws.invoke("report", "r1", "--format", "json").stdout)
        verified = ws.invoke("verify")
    assert receiver.commits == {}, "nothing was ever sent"
    rows_of = {i["id"]: i for i in reported["items"]}
    for item_id in claimed:
        row = rows_of[item_id]
        assert row["state"] == "pending"
        assert "asking again" not in (row["last_error"] or ""), row
        assert "not delivered" in (row["last_error"] or ""), row
    for name, text in texts.items():
        assert "asking again" not in text, (name, text)
    assert verified.exit_code == 0, verified.output
