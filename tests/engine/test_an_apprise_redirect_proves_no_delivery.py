"""A service's 3xx answer to the notification proves nothing about it (the webhook channel
never follows one, docs/guarantees.md: "a webhook's 3xx ... is such an answer too"). Apprise
follows redirects by default: a 302 to the POST becomes a GET of the Location, whose 200 it
reports as success. The notification, never processed (the GET carried none of it), must
not be recorded `sent` on that word."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.scripted_http import Reply, Script, scripted

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_302_answered_to_an_apprise_notification_is_never_recorded_sent(
    ws: Workspace,
) -> None:
    """The POST is answered 302 to a landing page that answers every GET 200."""
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
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "alerts")
    assert script.posted == 1
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == 0, (sent.output, script.got)
    assert ws.ledger.states() == {"u1": "unknown"}, sent.output
    assert sent.exit_code == 3, sent.output
