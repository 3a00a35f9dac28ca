"""A file sent again while its rows are open in a run still awaiting approval is refused
(exit 2, nothing stored), and so is its dry run. The advice names what works for such a run
(`resume` alone is refused until it is approved): review and approve it, then resume it; or
reject it and send the file again, its rows then awaiting approval again. Each way,
followed as printed, sends every row once. Both stores."""

from __future__ import annotations

import re
import shlex

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def _refused_advice(ws: Workspace, receiver: Receiver) -> dict[str, list[str]]:
    """The file planned awaiting approval (channel `hooks`, to `receiver`), then sent again:
    the refusal's commands, by name (the dry run's refusal says the same)."""
    (ws.path / "notifier.toml").write_text(webhook_config(receiver, idempotent=True, status=True))
    ws.write_csv("b.csv", make_rows(3))
    planned = ws.invoke("send", "b.csv", "--channel", "hooks", "--require-approval")
    assert planned.exit_code == 0, planned.output
    (run,) = ws.ledger.runs()
    assert run.state == "awaiting_approval"
    again = ws.invoke("send", "b.csv", "--channel", "hooks", "--require-approval")
    assert again.exit_code == 2, again.output
    assert f"are still open in run {run.run_id}, which awaits approval" in again.output
    dry = ws.invoke("send", "b.csv", "--channel", "hooks", "--dry-run")
    assert f"are still open in run {run.run_id}, which awaits approval" in dry.output
    commands = [shlex.split(c) for c in re.findall(r"`notifier ([^`]+)`", again.output)]
    assert [c[0] for c in commands] == ["preview", "approve", "resume", "reject"], commands
    assert all(c[1] == run.run_id for c in commands), commands
    return {c[0]: c for c in commands}


def test_approved_then_resumed_as_advised_the_run_sends_every_row_once(ws: Workspace) -> None:
    receiver = Receiver()
    with receiving(receiver):
        advised = _refused_advice(ws, receiver)
        preview = ws.invoke(*advised["preview"])
        assert preview.exit_code == 0, preview.output
        fingerprint = preview.output.strip().splitlines()[-1].split()[-1]
        assert fingerprint.startswith("sha256:"), preview.output
        approve = [fingerprint if a == "sha256:…" else a for a in advised["approve"]]
        assert ws.invoke(*approve).exit_code == 0
        resumed = ws.invoke(*advised["resume"])
        assert resumed.exit_code == 0, resumed.output
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}


def test_rejected_as_advised_the_file_sent_again_awaits_approval_again(ws: Workspace) -> None:
    receiver = Receiver()
    with receiving(receiver):
        advised = _refused_advice(ws, receiver)
        reject = ["not needed" if a == "TEXT" else a for a in advised["reject"]]
        rejected = ws.invoke(*reject)
        assert rejected.exit_code == 0, rejected.output
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 0, again.output
        assert [r.state for r in ws.ledger.runs()] == ["cancelled", "awaiting_approval"]
    assert receiver.deliveries() == {}
