"""Ctrl-C while requests are held, under --log-format json: the run pauses (exit 130), stderr
holds nothing but JSON events ending with the pause, and the items claimed ahead are logged
as released."""

from __future__ import annotations

import signal
import threading

import pytest

from ..cli.test_observe import json_lines
from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 8])
def test_ctrl_c_mid_run_logs_a_pause_and_only_json_on_stderr(ws: Workspace, n: int) -> None:
    """Ctrl-C while requests are held: the run pauses (exit 130), stderr holds nothing but
    JSON events ending with `pause`, every answer that came back has its outcome, and the
    items claimed ahead are logged as released."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(4 * n + 3))
        process = ws.popen(
            "send", "batch.csv", "--channel", "hooks", "--concurrency", str(n),
            "--run-id", "stopped", "--log-format", "json",
        )  # fmt: skip
        try:
            receiver.wait_for(lambda r: len(r.arrivals) == n)
            process.send_signal(signal.SIGINT)
            # The answers go back only once the Ctrl-C was taken: released earlier, a sender
            # could start its next item before the signal reached the process.
            assert process.stdout is not None
            while "Ctrl-C: finishing" not in (line := process.stdout.readline()):
                assert line, "the send ended without taking the Ctrl-C"
            hold.set()
            out, err = process.communicate(timeout=60)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 130, out + err
    events = json_lines(err)
    assert events[-1]["event"] == "pause" and events[-1]["state"] == "paused", events[-1]
    answers = {e["seq"] for e in events if e["event"] == "answer"}
    outcomes = {e["seq"]: e["outcome"] for e in events if e["event"] == "outcome"}
    assert len(answers) == n and answers <= outcomes.keys()
    # The items claimed ahead never started: given back, each with its outcome event.
    assert {o for seq, o in outcomes.items() if seq not in answers} <= {"release"}
