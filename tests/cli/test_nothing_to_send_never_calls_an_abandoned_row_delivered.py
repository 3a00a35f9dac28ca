"""A file sent again whose only row left was abandoned by an operator (`reconcile --manual
--mark abandon`: nobody can tell whether it arrived) plans nothing, rightly; the line that
says so never states that every row "was already delivered": the abandoned row is maybe
delivered, and the operator abandoned it for want of knowing. Both stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_nothing_to_send_after_an_abandoned_row_does_not_call_it_delivered(ws: Workspace) -> None:
    receiver = Receiver(answer=lambda item_id, n: 504)  # the gateway's 504: outcome unknown
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        ws.write_csv("b.csv", make_rows(1))
        first = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert first.exit_code == 3, first.output
        (run,) = ws.ledger.runs()
        assert ws.ledger.states() == {"u1": "unknown"}
        abandoned = ws.invoke("reconcile", run.run_id, "--manual", "--item", "u1",
                              "--mark", "abandon", "--evidence", "cannot tell")  # fmt: skip
        assert abandoned.exit_code == 3, abandoned.output
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert again.exit_code == 0, again.output
    assert "abandoned by an operator" in again.output  # the line about the earlier run
    assert "was already delivered" not in again.output, again.output
