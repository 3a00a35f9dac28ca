"""An address suppressed after its item was claimed, while the channel's connection is still
being made (a relay slow to greet, a login that takes seconds), is never handed the message:
the channel's last check once its connection is ready (`ready`, before MAIL FROM or a
request's first byte) sees the list as it is then. docs/guarantees.md, Suppression ("An
address suppressed mid-run gets only the requests already under way") and the sender's
promise in engine/sending.py that every rule, a suppression included, is checked again once
the connection is ready.

At --concurrency 1 the sender is the committer's own thread, so the committer's look at the
list (every 0.2 s while sends are in flight) never happens while that send connects: the
check read the list as it was before the item was claimed, however long the connection
took."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from notifier.channels import Ready, go_ahead
from notifier.domain.answers import Receipt
from notifier.domain.intent import Intent

from ..conftest import Workspace
from ..support.held import WAIT_S, Answered, HeldRun

pytestmark = pytest.mark.both_stores


@dataclass
class SlowToConnect(Answered):
    """A downstream whose connection is ready only once the test says so: each send notes
    that it is connecting, waits for `connected`, then asks the sender's last check (as
    SMTP does after its greeting, EHLO and login) and hands the message over."""

    connecting: threading.Event = field(default_factory=threading.Event)
    connected: threading.Event = field(default_factory=threading.Event)
    handed_over: list[str] = field(default_factory=list)

    def send(self, intent: Intent, ready: Ready = lambda: None) -> Receipt:
        self.connecting.set()
        assert self.connected.wait(WAIT_S), "the test never let the connection be ready"
        go_ahead(ready)
        self.handed_over.append(intent.item_id)
        return Receipt("r-" + intent.item_id, intent.intent_digest)


@pytest.mark.timeout(60)
def test_an_address_suppressed_while_its_connection_opens_is_never_handed_the_message(
    ws: Workspace,
) -> None:
    channel = SlowToConnect()
    run = HeldRun(ws, channel, 1, 2, hold=False, to="ann@example.com")
    run.thread.start()
    try:
        assert channel.connecting.wait(WAIT_S), "the first send never started to connect"
        added = ws.invoke("suppress", "add", "ann@example.com", "--reason", "complained")
        assert added.exit_code == 0, added.output
        channel.connected.set()
        run.wait_taken(1)
    finally:
        result = run.finish(channel)
    assert channel.handed_over == [], "a message was handed over to a suppressed address"
    assert result.stop.value == "completed", result
    assert ws.ledger.state_counts() == {"suppressed": 2}
