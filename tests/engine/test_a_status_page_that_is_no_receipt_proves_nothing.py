"""A status query proves a delivery only by a receipt: `200` with a JSON document (DESIGN.md
section 8: "GET status_url → 200 JSON (with intent_digest when the downstream stored it) =
found, 404 = not found, anything else = still uncertain"). A status URL answered by
something that is not the receiver's status endpoint (a login page, a framework's
catch-all route, a proxy's welcome page: `200 text/html` for every path) holds no receipt:
an item whose request the receiver never committed is not `sent` on its word. At N = 1 and
at N = 8 with more rows than senders (the channel can be asked: items claimed ahead)."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace
from ..support.halts import claimed_ahead, send_through_halts
from ..support.scripted_http import Reply, Script, hooks_config, scripted

# The pauses between a status query's tries, and the backoffs, at the test switch's scale
# (waits.py): what an answer proves does not depend on how long they are.
pytestmark = [
    pytest.mark.both_stores,
    pytest.mark.timeout(180),  # a bound on a hang, far past a loaded machine's 20 s
    pytest.mark.usefixtures("fast_waits"),
]

GATEWAY_TIMEOUT = Reply(504, b'{"error": "gateway timeout"}')
PAGES = {
    "html": Reply(200, b"<html><body>Sign in</body></html>", (("Content-Type", "text/html"),)),
    "empty": Reply(200, b"", ()),
}


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_200_without_a_json_receipt_never_makes_an_item_sent(
    ws: Workspace, page: str, n: int
) -> None:
    """Every item's POST is answered 504 and never committed; every status query is
    answered 200 with no receipt in it. Every item ends maybe delivered (unknown), never
    `sent`, POSTed once (an item claimed ahead and given back at the halt never), and the
    report shows no receipt found by query."""
    rows = 1 if n == 1 else 2 * n
    script = Script(posts=[GATEWAY_TIMEOUT], gets=[PAGES[page]])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=True))
        results = send_through_halts(ws, rows, n, "hooks")
    said = [r.output for r in results]
    keys = ws.ledger.keys()
    assert script.posted_by == dict.fromkeys(keys, 1), said  # each once, none twice
    assert all(script.got_by[key] >= 1 for key in keys), script.got_by  # each one asked
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == 0, (said, report["items"])
    assert report["counts"]["unknown"] == rows, (said, report["counts"])
    assert ws.ledger.states() == {f"u{i}": "unknown" for i in range(1, rows + 1)}, said
    assert [r.exit_code for r in results] == [3] * len(results), said
    assert claimed_ahead(ws) == (n > 1)
