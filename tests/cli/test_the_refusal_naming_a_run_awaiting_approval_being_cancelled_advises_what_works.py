"""A run awaiting approval whose cancel was asked for and not finished (a cancel without
the audit key, refused with exit 4: its flag stays set) sends nothing more: approved and
resumed, it is closed as cancelled. A file whose rows are open in it is refused (exit 2,
nothing stored); the refusal's advice, its first way followed word for word (and the file
sent again where it says so), must deliver every row once, never promise that `resume`
sends that run. Both stores."""

from __future__ import annotations

import re
import shlex

import pytest

from notifier.domain.chain import KEY_ENV

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.audited import KEY

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_the_refusal_over_a_run_awaiting_approval_being_cancelled_works_as_advised(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("b.csv", make_rows(3))
        planned = ws.invoke("send", "b.csv", "--channel", "hooks", "--require-approval")
        assert planned.exit_code == 0, planned.output
        (run,) = ws.ledger.runs()
        keyless = ws.invoke("cancel", run.run_id, env={KEY_ENV: ""})
        assert keyless.exit_code == 4, keyless.output  # the flag is set, the run not closed
        assert ws.ledger.run(run.run_id).cancel_requested_at is not None
        assert ws.ledger.run(run.run_id).state == "awaiting_approval"
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 2, again.output
        dry = ws.invoke("send", "b.csv", "--channel", "hooks", "--dry-run")
        assert " Or " in again.output or "send the file again" in again.output, again.output
        first_way = again.output.split(" Or ")[0]
        assert first_way.split("Nothing was stored.")[1] in dry.output, dry.output
        for command in re.findall(r"`notifier ([^`]+)`", first_way):
            args = shlex.split(command)
            if args[0] == "approve":
                preview = ws.invoke("preview", run.run_id)
                fingerprint = preview.output.strip().splitlines()[-1].split()[-1]
                args = [fingerprint if a == "sha256:…" else a for a in args]
            followed = ws.invoke(*args)
            assert followed.exit_code in (0, 3), (command, followed.output)
        if "send the file again" in first_way:
            sent = ws.invoke("send", "b.csv", "--channel", "hooks")
            assert sent.exit_code == 0, sent.output
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}, again.output
