"""A status query proves a delivery only by a receipt: `200` with a JSON document (DESIGN.md
section 8: "GET status_url → 200 JSON (with intent_digest when the downstream stored it) =
found, 404 = not found, anything else = still uncertain"). A status URL answered by
something that is not the receiver's status endpoint (a login page, a framework's
catch-all route, a proxy's welcome page: `200 text/html` for every path) holds no receipt:
an item whose request the receiver never committed is not `sent` on its word."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.scripted_http import Reply, Script, hooks_config, scripted

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

GATEWAY_TIMEOUT = Reply(504, b'{"error": "gateway timeout"}')
PAGES = {
    "html": Reply(200, b"<html><body>Sign in</body></html>", (("Content-Type", "text/html"),)),
    "empty": Reply(200, b"", ()),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_200_without_a_json_receipt_never_makes_an_item_sent(ws: Workspace, page: str) -> None:
    """The POST is answered 504 and never committed; every status query is answered 200
    with no receipt in it. The item ends maybe delivered (unknown), never `sent`, and the
    report shows no receipt found by query."""
    script = Script(posts=[GATEWAY_TIMEOUT], gets=[PAGES[page]])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=True))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert script.got >= 1  # the status URL was asked
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == 0, (sent.output, report["items"])
    assert ws.ledger.states() == {"u1": "unknown"}, sent.output
    assert sent.exit_code == 3, sent.output
