"""Without --log-bodies no --log-format json line carries a recipient (notifier/observe/logs.py:
"What a line never carries: ... the recipient"). That holds for the `error` event too: a batch
file refused while planning for a bad `to` cell is named by its line, and the JSON line
a log pipeline keeps quotes no address of it."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)
ADDRESS = "ann.private@example.com"


def test_a_file_refused_for_a_bad_to_logs_its_line_not_the_address(ws: Workspace) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 2525\n'
        'sender = "ops@example.com"\n'
    )
    ws.write_csv("mail.csv", [["to"], ["ok@example.com"], [f"{ADDRESS}>"]])
    refused = ws.invoke("send", "mail.csv", "--channel", "mail", "--log-format", "json")
    assert refused.exit_code == 2, refused.output
    (line,) = refused.stderr.strip().splitlines()
    event = json.loads(line)
    assert event["event"] == "error" and "line 3" in event["message"], event
    assert "ann.private" not in refused.stderr, refused.stderr
