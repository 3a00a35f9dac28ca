"""`notifier reject --reason …` without RUN_ID picks the newest unfinished run. When that
run is not the one awaiting approval (a later file's run, paused with rows still to send),
the refusal must name the run that awaits approval, never advise cancelling the run it
happened to pick: followed word for word, that advice stopped a run the operator never
named (its rows left unsent until its file is sent again) and left the run they meant to
reject awaiting approval. Followed word for word, the advice rejects the run awaiting
approval and leaves the other one as it was. Both stores."""

from __future__ import annotations

import re
import shlex

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_reject_without_a_run_id_names_the_run_awaiting_approval(ws: Workspace) -> None:
    # u5's first answer is a 500 from a receiver that can be neither asked nor dedupes:
    # the later run stops paused, one row unknown.
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u5", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("review.csv", make_rows(3))
        ws.write_csv("later.csv", make_rows(3, start=4))
        planned = ws.invoke(
            "send", "review.csv", "--channel", "hooks", "--run-id", "r1", "--require-approval"
        )
        assert planned.exit_code == 0, planned.output
        later = ws.invoke("send", "later.csv", "--channel", "hooks", "--run-id", "r2")
        assert later.exit_code == 3, later.output
        assert ws.ledger.run("r2").state == "paused"

        refused = ws.invoke("reject", "--reason", "wrong list")
        assert refused.exit_code == 2, refused.output
        assert ws.ledger.run("r1").state == "awaiting_approval"
        assert "`notifier cancel r2`" not in refused.output, refused.output
        assert "`notifier reject r1 " in refused.output, refused.output
        # Followed word for word (the reason filled in where the advice leaves it open).
        for command in re.findall(r"`notifier ([^`]+)`", refused.output):
            words = [
                "wrong list" if word in ("TEXT", "…") else word for word in shlex.split(command)
            ]
            followed = ws.invoke(*words)
            assert followed.exit_code == 0, (command, followed.output)
    assert ws.ledger.run("r1").state == "cancelled"  # rejected
    assert ws.ledger.run("r2").state == "paused"  # untouched
    assert receiver.deliveries() == {"u4": 1, "u6": 1}
