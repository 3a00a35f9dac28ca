"""A 429 or 503 is the channel's answer, "seen but not processed", whatever its Retry-After
holds: one that cannot be read is ignored (the backoff applies), as DESIGN.md section 7
reads it. `Retry-After: ²` (a superscript two, which Python's str.isdigit accepts and
float() refuses, sent as the latin-1 byte 0xB2 by http.server) must neither turn a 429
into "may have been delivered" nor stop `reconcile` or `cancel` with an internal error
(exit 1): the contract gives them a message and exit 0 or 3."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.scripted_http import Reply, Script, hooks_config, scripted

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

UNREADABLE = (("Retry-After", "\u00b2"), ("Content-Type", "application/json"))
ACCEPTED = Reply(201, b'{"id": "dlv-1"}')


def test_a_429_with_an_unreadable_retry_after_is_retried_and_delivered_once(
    ws: Workspace,
) -> None:
    """A webhook that can neither dedupe nor be asked: its first answer, 429, says nothing
    was processed, so the item is sent again and delivered, never left unknown."""
    script = Script(posts=[Reply(429, b'{"error": "slow down"}', UNREADABLE), ACCEPTED])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=False))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert ws.ledger.states() == {"u1": "sent"}, sent.output
    assert script.posted == 2
    assert sent.exit_code == 0, sent.output


@pytest.mark.parametrize("command", ["reconcile", "cancel"])
def test_a_status_query_throttled_with_an_unreadable_retry_after_never_stops_a_command(
    ws: Workspace, command: str
) -> None:
    """The POST is answered 504 (maybe delivered), the send's status query (its three
    tries) 500, so the item ends unknown; every later query 503 with an unreadable
    Retry-After: the item stays unknown, and `reconcile` and `cancel` end with their message
    and exit code (cancel: the run cancelled), never an internal error."""
    failed = Reply(500, b'{"error": "oops"}')
    script = Script(
        posts=[Reply(504, b'{"error": "gateway timeout"}')],
        gets=[failed, failed, failed, Reply(503, b'{"error": "busy"}', UNREADABLE)],
    )
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=True))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
        assert ws.ledger.states() == {"u1": "unknown"}, sent.output
        assert script.got == 3
        settled = ws.invoke(command)
    assert script.got > 3  # asked, and throttled
    assert settled.exit_code in (0, 3), settled.output
    assert "internal error" not in settled.output
    assert ws.ledger.states() == {"u1": "unknown"}, settled.output
    if command == "cancel":
        assert json.loads(ws.invoke("status", "--json").output)["state"] == "cancelled"
