"""Defects found in review of the 93685c8..main merge, each pinned through the real CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Workspace, make_rows, smtp_server
from .test_suppression import Relay

pytestmark = pytest.mark.both_stores


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("n", [1, 8])
def test_json_log_never_names_a_recipient_rejected_at_rcpt(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """Without --log-bodies no JSON log line carries a recipient, even one a relay echoes."""
    relay.rcpt_answers["user4@example.com"] = "550 5.1.1 <user4@example.com>: no such user"
    ws.write_csv("batch.csv", make_rows(6))
    done = ws.run(
        "send", "batch.csv", "--channel", "mail", "--concurrency", str(n),
        "--log-format", "json",
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert any(e.get("attempt_outcome") == "permanent" for e in lines), lines
    assert "user4@example.com" not in done.stderr
