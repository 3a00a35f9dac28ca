"""A row without an id is held only by earlier rows of its very content. Row `u1` once had
content X (never sent: its run was cancelled before approval), and `u1` is now open with
content Y in a run awaiting approval: the file without ids whose row has content X names no
notification that is open anywhere (Y is another one, and X never left), so it is planned,
not refused as "still open" in the run that holds Y. On both stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

HEAD = ["id", "to", "subject", "body"]


def test_a_row_without_an_id_is_not_refused_as_open_for_another_content_of_its_old_id(
    ws: Workspace,
) -> None:
    ws.write_csv("x.csv", [HEAD, ["u1", "alice@example.com", "Hi", "X"]])
    first = ws.invoke("send", "x.csv", "--require-approval")
    assert first.exit_code == 0, first.output
    run_x = ws.ledger.run().run_id
    cancelled = ws.invoke("cancel", run_x)
    assert ws.ledger.run(run_x).state == "cancelled", cancelled.output
    ws.write_csv("y.csv", [HEAD, ["u1", "alice@example.com", "Hi", "Y"]])
    second = ws.invoke("send", "y.csv", "--require-approval")
    assert second.exit_code == 0, second.output
    ws.write_csv("plain.csv", [HEAD[1:], ["alice@example.com", "Hi", "X"]])
    third = ws.invoke("send", "plain.csv", "--require-approval")
    assert third.exit_code == 0, third.output
