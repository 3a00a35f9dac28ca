"""A plain `reconcile` of a paused run that proves an unknown item undelivered puts it back
to pending: nothing sends it until the run is resumed. The reconcile said "will send again
with the same key", then "run r1: paused", exit 0, naming no command: an operator who ran
the reconcile the run's advice pointed to was left with a row that no process would ever
send. The reconcile must name the `notifier resume` that sends it; followed word for word,
every row is delivered once. Both stores."""

from __future__ import annotations

import re
import shlex
from datetime import timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_reconcile_that_leaves_a_row_pending_names_the_resume_that_sends_it(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # u2's first request is answered 500 and not taken; while the run sends, its status
    # queries are throttled, so it stops with u2 unknown.
    receiver = Receiver(
        answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None,
        query_status=503,
    )
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(
                receiver,
                idempotent=False,
                status=True,
                timeout=1,
                retry="[retry]\nmax_attempts = 3\nbackoff_base = 0.02\nbackoff_max = 0.1\n",
            )
        )
        ws.write_csv("b.csv", make_rows(3))
        sent = ws.invoke("send", "b.csv", "--channel", "hooks", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u2").state == "unknown"
        receiver.query_status = None  # the receiver answers its queries again
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(hours=1))

        reconciled = ws.invoke("reconcile", "r1")
        assert reconciled.exit_code == 0, reconciled.output
        assert ws.ledger.item("u2").state == "pending"
        assert ws.ledger.run("r1").state == "paused"
        assert "`notifier resume r1`" in reconciled.output, reconciled.output
        for command in re.findall(r"`notifier ([^`]+)`", reconciled.output):
            followed = ws.invoke(*shlex.split(command))
            assert followed.exit_code == 0, (command, followed.output)
    assert ws.ledger.run("r1").state == "completed"
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}
