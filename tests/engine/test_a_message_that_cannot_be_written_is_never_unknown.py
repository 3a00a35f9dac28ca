"""A message is built before its connection is taken (notifier/channels/smtp.py: `_build`,
"Raises PERMANENT, before any network traffic"), so a message the email package cannot
write was never sent and may never make its item `unknown` (maybe delivered, an
operator's decision). A subject with a non-ASCII letter and an RFC 2047 encoded word whose
bytes are not in its charset (`Réunion =?utf-8?q?=E9t=E9?=`, Latin-1 labelled UTF-8) made
the email package raise UnicodeEncodeError while writing the header; the channel let it
through, and the runner took it for a failure of a request under way. The item fails, the
relay receives nothing for it, and the other rows are delivered."""

from __future__ import annotations

from typing import Any

import pytest

from ..conftest import Workspace, smtp_server
from ..support.smtp import Inbox

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]
SUBJECTS = [
    "Réunion =?utf-8?q?=E9t=E9?=",
    "é =?utf-8?b?" + "a" * 80 + "?=x",
]


@pytest.fixture
def inbox(ws: Workspace) -> Any:
    handler = Inbox()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("subject", SUBJECTS)
def test_a_subject_the_email_package_cannot_write_fails_its_item_never_unknown(
    ws: Workspace, inbox: Inbox, subject: str
) -> None:
    rows = [
        ["id", "to", "subject", "body"],
        ["r1", "ann@example.com", "Before", "B"],
        ["r2", "bob@example.com", subject, "B"],
        ["r3", "cid@example.com", "After", "B"],
    ]
    ws.write_csv("batch.csv", rows)
    sent = ws.invoke("send", "batch.csv", "--channel", "mail")
    states = {i.item_id: i.state for i in ws.ledger.items()}
    assert states == {"r1": "sent", "r2": "failed", "r3": "sent"}, (states, sent.output)
    assert sent.exit_code == 3, sent.output
    assert sorted(str(m["Subject"]) for m in inbox.messages) == ["After", "Before"]
