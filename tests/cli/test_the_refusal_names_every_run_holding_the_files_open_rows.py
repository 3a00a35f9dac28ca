"""A file whose open rows sit in two unfinished runs (one paused with a row whose outcome
nobody knows, one awaiting approval) is refused (exit 2, nothing stored), and so is its dry
run. The refusal must not put every open row in the run awaiting approval: its advice
(approve and resume that run) would leave the row of the other run unnamed, and never sent
by anyone following it. Both stores."""

from __future__ import annotations

import re

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_refusal_over_two_open_runs_names_both(ws: Workspace) -> None:
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u1", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("first.csv", make_rows(1))
        first = ws.invoke("send", "first.csv", "--channel", "hooks", "--run-id", "ra")
        assert first.exit_code == 3, first.output
        assert ws.ledger.item("u1", "ra").state == "unknown"  # open in ra, paused
        ws.write_csv("rest.csv", make_rows(2, start=2))
        rest = ws.invoke("send", "rest.csv", "--channel", "hooks", "--run-id", "rb",
                         "--require-approval")  # fmt: skip
        assert rest.exit_code == 0, rest.output
        assert ws.ledger.run("rb").state == "awaiting_approval"
        ws.write_csv("all.csv", make_rows(3))
        again = ws.invoke("send", "all.csv", "--channel", "hooks")
        dry = ws.invoke("send", "all.csv", "--channel", "hooks", "--dry-run")
    assert again.exit_code == 2, again.output
    for said in (again.output, dry.output):
        assert "3 row(s) are still open in run rb" not in said, said
        assert re.search(r"\bra\b", said), said  # u1's run is named
