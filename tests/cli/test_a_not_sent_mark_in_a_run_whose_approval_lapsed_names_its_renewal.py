"""An item marked not sent by hand is sent again by the run's `resume`, but a run whose
approval has expired sends nothing until it is approved again (`resume` is refused). The
mark must say so, with the commands that renew the approval: "it will be sent on resume"
alone, followed, is refused. Followed word for word (the fingerprint taken from the
preview's last line, as the advice says), the advice delivers every row once. Both
stores."""

from __future__ import annotations

import re
import shlex
from datetime import timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


def test_a_not_sent_mark_after_the_approval_lapsed_advises_renewing_it(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A receiver that can neither dedupe nor be asked; its first answer to u2 is a 500.
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("batch.csv", make_rows(3))
        planned = ws.invoke(
            "send", "batch.csv", "--channel", "hooks", "--run-id", "r1", "--require-approval"
        )
        assert planned.exit_code == 0, planned.output
        fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", planned.output)
        assert fingerprint is not None, planned.output
        approved = ws.invoke("approve", "r1", "--fingerprint", fingerprint[1], "--expires-in", "1h")
        assert approved.exit_code == 0, approved.output
        sent = ws.invoke("resume", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u2").state == "unknown"
        # Two hours on: the approval has lapsed, and the receiver's window for u2 is over.
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(hours=2))

        marked = ws.invoke("reconcile", "r1", "--manual", "--item", "u2", "--mark", "not-sent",
                           "--evidence", "never reached the gateway")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        said = marked.output
        assert "`notifier approve r1" in said and "`notifier resume r1`" in said, said
        # Followed word for word; the fingerprint is the preview's last line.
        shown = ""
        for command in re.findall(r"`notifier ([^`]+)`", said):
            words = shlex.split(command.replace("sha256:…", shown))
            followed = ws.invoke(*words)
            assert followed.exit_code == 0, (command, followed.output)
            if words[0] == "preview":
                shown = followed.stdout.strip().splitlines()[-1].removeprefix("fingerprint: ")
    assert ws.ledger.run("r1").state == "completed"
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}
