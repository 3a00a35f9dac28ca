"""What the operator is told matches what happened: nothing says "resuming" before the run is
ours, and a run whose channels can no longer be built can still be cancelled."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from notifier.api import Notifier
from notifier.channels.scripted import DELIVER, Channels, Response, ScriptedChannel
from notifier.config import Config
from notifier.domain.intent import Intent
from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, make_rows
from ..support.background import WAIT_S, Worker
from ..support.crashed import crash_invoke

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_a_refused_resume_does_not_first_say_resuming(ws: Workspace) -> None:
    """A second `resume` while a live worker holds the lease exits 4 naming the holder, and
    never prints "resuming run" first. The worker is the engine in a thread of this process,
    its first request held until the resume has been refused."""
    started, release = threading.Event(), threading.Event()

    def held(intent: Intent, tries: int) -> Response:
        started.set()
        release.wait(WAIT_S)
        return DELIVER

    hooks = {"type": "webhook", "url": "http://127.0.0.1:9/n"}  # never dialled: held answers
    notifier = Notifier.open(
        ws.db,
        config=Config(path=None, channels={"hooks": hooks}),
        channels=Channels(hooks=ScriptedChannel("hooks", held)),
    )
    ws.write_csv("batch.csv", make_rows(3))
    worker = Worker(lambda: notifier.send(Path("batch.csv"), channel="hooks"))
    try:
        assert started.wait(WAIT_S), "the worker never sent"
        second = ws.invoke("resume")
    finally:
        release.set()
    assert worker.result().counts.sent == 3
    assert second.exit_code == 4, second.output
    assert f"pid {os.getpid()}" in second.output
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
        secret = {"HOOKS_SECRET": SECRET}  # set for the send alone
        crash_invoke(ws, "after-send:3", "send", "batch.csv", "--channel", "hooks", env=secret)
    assert "HOOKS_SECRET" not in os.environ  # this shell never had it
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 3, cancelled.output
    assert "internal error" not in cancelled.stderr
    assert ws.ledger.run().state == "cancelled"
    states = {i.seq: i.state for i in ws.ledger.items()}
    assert states == {1: "sent", 2: "sent", 3: "unknown", 4: "pending", 5: "pending"}
