"""Without --log-bodies no JSON log line carries a recipient (notifier/observe/logs.py), also
when the relay quotes it as the envelope carried it: an internationalised domain goes on the
wire as punycode (`ann@xn--bcher-kva.example` for `ann@bücher.example`), and a relay's 5.1.1
at RCPT names the address it was given, not the row's spelling."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..conftest import Workspace, smtp_server
from ..engine.test_suppression import Relay

pytestmark = pytest.mark.timeout(60)
ROW_TO = "ann@bücher.example"
WIRE_TO = "ann@xn--bcher-kva.example"


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.both_stores
def test_json_log_never_names_an_internationalised_recipient_the_relay_echoes(
    ws: Workspace, relay: Relay
) -> None:
    relay.rcpt_answers[WIRE_TO] = f"550 5.1.1 <{WIRE_TO}>: no such user"
    ws.write_csv("batch.csv", [["id", "to", "subject", "body"], ["r1", ROW_TO, "Hi", "Body"]])
    done = ws.invoke("send", "batch.csv", "--channel", "mail", "--log-format", "json")
    assert done.exit_code == 3, done.output
    assert relay.rcpts == [WIRE_TO]  # the relay was given the punycode spelling
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert any(e.get("attempt_outcome") == "permanent" for e in lines), lines
    assert WIRE_TO not in done.stderr and ROW_TO not in done.stderr, done.stderr
