"""A receiver that is down pauses the run: requests that cannot reach it
(refused, DNS, TLS, a relay refusing the connection) are the channel's failure, not the
items'. At N = 1 and 8, on both stores, through the real CLI against 127.0.0.1."""

from __future__ import annotations

import pytest
from aiosmtpd.controller import Controller

from ..conftest import Inbox, Workspace, make_rows
from ..receiver import Receiver, receiving
from ..support.net import refusing_port

pytestmark = pytest.mark.both_stores
CONCURRENCY = pytest.mark.parametrize("n", [1, 8])
# Two attempts an item: a closed port must not spend them and fail every item for good.
RETRY = "[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.05\n"


def _items(ws: Workspace) -> list[tuple[str, int]]:
    return [(i.state, i.attempts) for i in ws.ledger.items()]


def _assert_paused_for_the_channel(ws: Workspace, out: str, rows: int) -> None:
    assert "is down" in out and "notifier resume" in out, out
    run = ws.ledger.run()
    assert (run.state, run.stop_cause) == ("paused", "channel_down")
    assert _items(ws) == [("pending", 0)] * rows, "no item failed or counts as attempted"


@CONCURRENCY
def test_a_webhook_receiver_that_is_down_pauses_the_run_and_resume_finishes_it(
    ws: Workspace, n: int
) -> None:
    """Connection refused on every request: the run pauses (exit 3) naming the channel,
    every item pending and never attempted, none failed; once the receiver listens,
    `resume` sends each of them once."""
    receiver = Receiver()
    with refusing_port() as port:
        (ws.path / "notifier.toml").write_text(
            '[channels.hooks]\ntype = "webhook"\n'
            f'url = "http://127.0.0.1:{port}/notifications"\nidempotent = true\ntimeout = 5\n'
            + RETRY
        )
        ws.write_csv("batch.csv", make_rows(10))
        down = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
    assert down.exit_code == 3, down.output
    _assert_paused_for_the_channel(ws, down.stdout, 10)
    with receiving(receiver, port):
        resumed = ws.invoke("resume", "--concurrency", str(n))
    assert resumed.exit_code == 0, resumed.output
    assert receiver.commits == dict.fromkeys(ws.ledger.keys(), 1)


@CONCURRENCY
def test_an_smtp_relay_that_is_down_pauses_the_run_and_resume_finishes_it(
    ws: Workspace, n: int
) -> None:
    """No relay on the port: the run pauses (exit 3) naming the channel, the 5 items
    pending and never attempted; once the relay listens, `resume` delivers each once."""
    with refusing_port() as port:
        (ws.path / "notifier.toml").write_text(
            f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {port}\n'
            'sender = "ops@example.com"\n' + RETRY
        )
        ws.write_csv("batch.csv", make_rows(5))
        down = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
    assert down.exit_code == 3, down.output
    _assert_paused_for_the_channel(ws, down.stdout, 5)
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        resumed = ws.invoke("resume", "--concurrency", str(n))
    finally:
        controller.stop()
    assert resumed.exit_code == 0, resumed.output
    assert len(inbox.messages) == 5
