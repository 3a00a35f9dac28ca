"""Two Ctrl-C in a row leave at once (exit 130), no clean pause written; resume settles
whatever was in flight and each key is still committed once."""

from __future__ import annotations

import signal
import time

import pytest

from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.both_stores


def test_second_ctrl_c_exits_at_once_and_resume_settles(ws: Workspace) -> None:
    """Two Ctrl-C in a row leave immediately (130); resume settles whatever was in flight and
    each key is still committed once."""
    with Sandbox(faults=Faults(latency_ms=200)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            f'status_url = "{sandbox.url}/notifications/{{key}}"\n'
        )
        ws.write_csv("batch.csv", make_rows(30))
        worker = ws.popen("send", "batch.csv", "--channel", "hooks")
        deadline = time.monotonic() + 30
        while sandbox.stats()["totals"]["requests"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        worker.send_signal(signal.SIGINT)
        # The second Ctrl-C only once the first was taken (two at once would be one).
        assert worker.stdout is not None
        while "Ctrl-C: finishing" not in (line := worker.stdout.readline()):
            assert line, "the worker ended without taking the first Ctrl-C"
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=10) == 130
        # Left at once: no clean pause was written (a clean stop would say `paused`).
        assert ws.ledger.run().state == "running"
        assert ws.status()["state"] == "paused"  # a dead worker's run is, in effect, paused
        assert ws.invoke("resume").exit_code == 0
        stats = sandbox.stats()["keys"]
        for item in ws.ledger.items():
            assert stats[item.idempotency_key]["commits"] == 1
