"""An SMTP row's `to` is the address the envelope carries, or the file fails: smtplib puts
every envelope address through `email.utils.parseaddr` (its `quoteaddr`), which reads
`x:victim@example.com` as a group and gives the relay `<victim@example.com>`, and
`ann@example.com:x` as `<ann@example.com>`. Such a row would reach a mailbox the
suppression list and the row's identity know by another spelling: a suppressed address
mailed again. It fails the file while planning (exit 2, nothing stored), as any `to` the
relay would get in another spelling does (docs/guarantees.md, Suppression)."""

from __future__ import annotations

from typing import Any

import pytest

from ..conftest import Workspace, smtp_server
from .test_suppression import Relay

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("to", ["x:victim@example.com", "victim@example.com:x"])
def test_a_suppressed_address_is_never_reached_through_another_spelling_of_to(
    ws: Workspace, relay: Relay, to: str
) -> None:
    added = ws.invoke("suppress", "add", "victim@example.com", "--reason", "asked to stop")
    assert added.exit_code == 0, added.output
    ws.write_csv("batch.csv", [["id", "to", "subject", "body"], ["r1", to, "Hi", "Body"]])
    sent = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert "victim@example.com" not in relay.rcpts, (sent.exit_code, sent.output)
    assert relay.messages == []
    assert sent.exit_code == 2, sent.output
    assert "line 2" in sent.output
    assert ws.invoke("runs", "--json").output.count("run_id") == 0
