"""A relay's reply is quoted in the item's error (send's output, `report`, `status`): shown
literally, never acting on the operator's terminal (tests/cli/test_user_text.py: errors never
act as markup). A relay that put escape sequences in a reply (`ESC[1A ESC[2K` to rewrite
the line above, OSC 52 to write the operator's clipboard) had them printed raw by `send`
and `report` in a terminal: its control characters are replaced where the reply is read."""

from __future__ import annotations

from typing import Any

import pytest

from ..conftest import Workspace, make_rows, smtp_server
from .test_suppression import Relay

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]
REPLY = "550 5.7.1 \x1b[1A\x1b[2Krun: completed \x1b]52;c;ZWNobyBoaQ==\x07 denied"


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


def test_escape_sequences_in_a_relay_reply_reach_no_output(ws: Workspace, relay: Relay) -> None:
    relay.rcpt_answers["user1@example.com"] = REPLY
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert sent.exit_code == 3, sent.output
    assert "denied" in sent.output  # the reply is still quoted
    outputs = {"send": sent.output}
    for args in (["report"], ["status"], ["report", "--format", "csv"]):
        outputs[" ".join(args)] = ws.invoke(*args).output
    shown = {name: text for name, text in outputs.items() if "\x1b" in text or "\x07" in text}
    assert shown == {}, shown
