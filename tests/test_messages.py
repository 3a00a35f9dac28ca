"""What the operator is told matches what happened: nothing says "resuming" before the run is
ours, and a run whose channels can no longer be built can still be cancelled."""

from __future__ import annotations

import os
import time

from notifier.sandbox.server import Faults, Sandbox

from .conftest import Workspace, make_rows

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_a_refused_resume_does_not_first_say_resuming(ws: Workspace) -> None:
    """A second `resume` while a live worker holds the lease exits 4 naming the holder, and
    never prints "resuming run" first."""
    with Sandbox(faults=Faults(latency_ms=200)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
        )
        ws.write_csv("batch.csv", make_rows(30))
        worker = ws.popen("send", "batch.csv", "--channel", "hooks")
        try:
            deadline = time.monotonic() + 30
            while sandbox.stats()["totals"]["commits"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            second = ws.invoke("resume")
        finally:
            worker.kill()
            worker.wait()
    assert second.exit_code == 4, second.output
    assert f"pid {worker.pid}" in second.output
    assert "resuming run" not in second.output


def test_cancel_works_when_the_runs_channel_can_no_longer_be_built(ws: Workspace) -> None:
    """A run signed with a secret from the environment, crashed mid-send, is cancelled from a
    shell where the secret is not set: the in-flight item becomes unknown (it cannot be
    asked), the run ends cancelled, exit 3 — instead of refusing to cancel at all."""
    with Sandbox() as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            'secret_env = "HOOKS_SECRET"\n'
        )
        ws.write_csv("batch.csv", make_rows(5))
        crash = {"NOTIFIER_CRASH_AT": "after-send:3", "HOOKS_SECRET": SECRET}
        crashed = ws.run("send", "batch.csv", "--channel", "hooks", env=crash)
        assert crashed.returncode == 137
    assert "HOOKS_SECRET" not in os.environ  # this shell never had it
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 3, cancelled.output
    assert "internal error" not in cancelled.stderr
    assert ws.ledger.run().state == "cancelled"
    states = {i.seq: i.state for i in ws.ledger.items()}
    assert states == {1: "sent", 2: "sent", 3: "unknown", 4: "pending", 5: "pending"}
