"""No row puts a header into an SMTP message (notifier/channels/smtp.py: "anything that could
smuggle a header" is refused before any network traffic). A subject holding no control
character can still spell a line break as an RFC 2047 encoded word (`=?utf-8?q?…=0D=0A…?=`):
the email package decodes it when the header is set, and writes the decoded line break to
the wire, so `Bcc:` (or a second `From:`, a `Content-Type:`, an empty line and a body of the
row's choosing) became a header of the message. The relay must receive no header the
message does not set, whatever the subject."""

from __future__ import annotations

from typing import Any

import pytest

from ..conftest import Workspace, smtp_server
from ..support.smtp import Inbox

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]
SUBJECTS = {
    "q": "=?utf-8?q?Hello=0D=0ABcc:_victim@example.net?=",
    "b": "=?utf-8?b?SGVsbG8NCkJjYzogdmljdGltQGV4YW1wbGUubmV0?=",  # "Hello\r\nBcc: victim@…"
}


@pytest.fixture
def inbox(ws: Workspace) -> Any:
    handler = Inbox()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("spelling", sorted(SUBJECTS))
def test_an_encoded_line_break_in_a_subject_adds_no_header(
    ws: Workspace, inbox: Inbox, spelling: str
) -> None:
    rows = [["id", "to", "subject", "body"], ["r1", "ann@example.com", SUBJECTS[spelling], "B"]]
    ws.write_csv("batch.csv", rows)
    sent = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert sent.exit_code in (0, 3), sent.output  # sent with its subject whole, or refused
    for message in inbox.messages:
        assert message.get_all("Bcc") is None, message.as_string()
        assert "\n" not in str(message["Subject"]), message.as_string()
    if sent.exit_code == 3:  # refused: failed before anything reached the relay
        assert inbox.messages == []
        assert [i.state for i in ws.ledger.items()] == ["failed"]
