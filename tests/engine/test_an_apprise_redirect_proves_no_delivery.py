"""A service's 3xx answer to the notification proves nothing about it (the webhook channel
never follows one, docs/guarantees.md: "a webhook's 3xx ... is such an answer too"). Apprise
follows redirects by default: a 302 to the POST becomes a GET of the Location, whose 200 it
reports as success. The notification, never processed (the GET carried none of it), must
not be recorded `sent` on that word. At N = 1 and at N = 8 with more rows than senders
(Apprise can never be asked, so nothing is claimed ahead of a sender: pipeline.claim_ahead)."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace
from ..support.halts import send_through_halts
from ..support.scripted_http import Reply, Script, scripted

# The pauses between a status query's tries, and the backoffs, at the test switch's scale
# (waits.py): what an answer proves does not depend on how long they are.
pytestmark = [
    pytest.mark.both_stores,
    pytest.mark.timeout(180),  # a bound on a hang, far past a loaded machine's 20 s
    pytest.mark.usefixtures("fast_waits"),
]


@pytest.mark.parametrize("n", [1, 8])
def test_a_302_answered_to_an_apprise_notification_is_never_recorded_sent(
    ws: Workspace, n: int
) -> None:
    """Every POST is answered 302 to a landing page that answers every GET 200: every item
    is attempted once (Apprise's POSTs carry no key: as many POSTs as items, each item one
    attempt) and ends unknown, whichever command (send, or resume after a halt) sent it."""
    rows = 1 if n == 1 else 2 * n
    script = Script(
        posts=[Reply(302, b"", (("Location", "/landing"),))],
        gets=[Reply(200, b"<html>welcome</html>", (("Content-Type", "text/html"),))],
    )
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(
            "[channels.alerts]\n"
            'type = "apprise"\n'
            f'urls = ["json://127.0.0.1:{port}/notify"]\n'
            "timeout = 2\n"
        )
        results = send_through_halts(ws, rows, n, "alerts")
    said = [r.output for r in results]
    assert script.posted == rows, said
    # One attempt per item that left; at N = 8 one claimed as the halt came is given back
    # unstarted (never left) and sent by the resume.
    left = [a.seq for a in ws.ledger.attempts() if a.outcome != "not_started"]
    assert sorted(left) == list(range(1, rows + 1)), said
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == 0, (said, script.got)
    assert report["counts"]["unknown"] == rows, (said, report["counts"])
    assert ws.ledger.states() == {f"u{i}": "unknown" for i in range(1, rows + 1)}, said
    assert [r.exit_code for r in results] == [3] * len(results), said
