"""Ctrl-C pauses a run; a recipient suppressed while it is paused is never sent on resume, and
an item whose request may have been delivered is never reported as suppressed (never sent)."""

from __future__ import annotations

import signal
import time

import pytest

from ..conftest import Workspace, make_rows, wait_for
from ..engine import test_suppression
from ..engine.test_suppression import CONCURRENCY, Relay, report
from ..receiver import Receiver, webhook_config

pytestmark = pytest.mark.both_stores
receiver = test_suppression.receiver  # a fixture of that module's, found here by name
relay = test_suppression.relay  # a fixture of that module's, found here by name


@pytest.mark.parametrize("n", CONCURRENCY)
def test_an_address_suppressed_while_the_run_is_paused_is_not_sent_on_resume(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """Ctrl-C while the relay holds the first n messages: the run pauses (exit 130); `suppress
    add` then puts later recipients on the list; `resume` never sends them and exits 0."""
    relay.release.clear()
    ws.write_csv("batch.csv", make_rows(20))
    worker = ws.popen("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
    try:
        wait_for(lambda: relay.held >= n, f"{n} messages held at the relay")
        worker.send_signal(signal.SIGINT)
        relay.release.set()
        assert worker.wait(timeout=60) == 130, worker.stderr.read() if worker.stderr else ""
    finally:
        relay.release.set()
        worker.kill()
        worker.wait()
    assert ws.status()["state"] == "paused"
    late = [f"user{i}@example.com" for i in (15, 17, 20)]
    assert ws.invoke("suppress", "add", *late).exit_code == 0
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert not set(late) & set(relay.rcpts)
    data = report(ws)
    assert (data["counts"]["sent"], data["counts"]["suppressed"]) == (17, 3)


def test_a_maybe_delivered_item_is_not_called_suppressed_never_sent(
    ws: Workspace, receiver: Receiver
) -> None:
    """An item whose timed-out request the receiver committed, then suppressed while the run
    is paused, is not reported `suppressed` (never sent) with exit 0 on resume."""

    def answer(item_id: str, n: int) -> int | None:
        if item_id == "u3" and n == 1:
            time.sleep(1.5)  # past the channel's 1 s timeout: the client sees no answer
        return None  # then committed: the request was delivered

    receiver.answer = answer
    (ws.path / "notifier.toml").write_text(
        webhook_config(receiver, idempotent=True, status=False, timeout=1)
    )
    ws.write_csv("batch.csv", make_rows(5))
    worker = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", "1")
    try:
        receiver.wait_for(lambda r: r.posts("u3") >= 1)
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=60) == 130, worker.stderr.read() if worker.stderr else ""
    finally:
        worker.kill()
        worker.wait()
    receiver.wait_for(lambda r: len(r.commits) >= 3)  # u3's request was committed
    [attempt] = ws.ledger.attempts(seq=3)
    assert attempt.outcome == "uncertain"
    assert ws.invoke("suppress", "add", "user3@example.com").exit_code == 0
    resumed = ws.invoke("resume")
    (state,) = [i["state"] for i in report(ws)["items"] if i["id"] == "u3"]
    assert not (state == "suppressed" and resumed.exit_code == 0), resumed.output
