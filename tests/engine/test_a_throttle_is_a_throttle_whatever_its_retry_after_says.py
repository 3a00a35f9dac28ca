"""A 429 or 503 is the channel's answer, "seen but not processed", whatever its Retry-After
holds: one that cannot be read is ignored (the backoff applies), as DESIGN.md section 7
reads it. `Retry-After: ²` (a superscript two, which Python's str.isdigit accepts and
float() refuses, sent as the latin-1 byte 0xB2 by http.server) must neither turn a 429
into "may have been delivered" nor stop `reconcile` or `cancel` with an internal error
(exit 1): the contract gives them a message and exit 0 or 3. At N = 1 and at N = 8 with
more rows than senders (claimed ahead where the channel can be asked), of every item."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.halts import all_unknown_and_asked
from ..support.scripted_http import Reply, Script, hooks_config, scripted

# The pauses between a status query's tries, and the backoffs, at the test switch's scale
# (waits.py): what an answer proves does not depend on how long they are.
pytestmark = [
    pytest.mark.both_stores,
    pytest.mark.timeout(180),  # a bound on a hang, far past a loaded machine's 20 s
    pytest.mark.usefixtures("fast_waits"),
]

UNREADABLE = (("Retry-After", "\u00b2"), ("Content-Type", "application/json"))
ACCEPTED = Reply(201, b'{"id": "dlv-1"}')


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("asked", [False, True], ids=["unasked", "asked"])
def test_a_429_with_an_unreadable_retry_after_is_retried_and_delivered_once(
    ws: Workspace, n: int, asked: bool
) -> None:
    """A webhook that cannot dedupe: its first answer to every item, 429, says nothing was
    processed, so each is sent again and delivered, never left unknown. Where it can be
    asked (at N = 8 items then claimed ahead), none is asked about: a 429 is no doubt."""
    rows = 1 if n == 1 else 2 * n
    script = Script(posts=[Reply(429, b'{"error": "slow down"}', UNREADABLE), ACCEPTED])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=asked))
        ws.write_csv("batch.csv", make_rows(rows))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
    assert ws.ledger.states() == {f"u{i}": "sent" for i in range(1, rows + 1)}, sent.output
    assert script.posted_by == dict.fromkeys(ws.ledger.keys(), 2)
    assert script.got == 0, script.got_by
    assert sent.exit_code == 0, sent.output


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("command", ["reconcile", "cancel"])
def test_a_status_query_throttled_with_an_unreadable_retry_after_never_stops_a_command(
    ws: Workspace, command: str, n: int
) -> None:
    """Every item's POST is answered 504 (maybe delivered), the send's status query of it
    (its three tries) 500, so every item ends unknown; every later query 503 with an
    unreadable Retry-After: every item stays unknown, none POSTed again, and `reconcile`
    and `cancel` end with their message and exit code (cancel: the run cancelled), never an
    internal error."""
    rows = 1 if n == 1 else 2 * n
    failed = Reply(500, b'{"error": "oops"}')
    script = Script(
        posts=[Reply(504, b'{"error": "gateway timeout"}')],
        gets=[failed, failed, failed, Reply(503, b'{"error": "busy"}', UNREADABLE)],
    )
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=True))
        asked = all_unknown_and_asked(ws, script.got_by.__getitem__, rows, n)
        keys = list(asked)
        settled = ws.invoke(command)
    # Every item asked again, each answered the 503 with its unreadable Retry-After by now.
    assert all(asked[key] < script.got_by[key] for key in keys), script.got_by
    assert all(script.got_by[key] > 3 for key in keys), script.got_by
    assert script.posted_by == dict.fromkeys(keys, 1)
    assert settled.exit_code in (0, 3), settled.output
    assert "internal error" not in settled.output
    assert set(ws.ledger.states().values()) == {"unknown"}, settled.output
    if command == "cancel":
        assert json.loads(ws.invoke("status", "--json").output)["state"] == "cancelled"
