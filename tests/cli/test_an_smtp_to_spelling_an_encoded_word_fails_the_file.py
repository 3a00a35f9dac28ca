"""An SMTP `to` whose local part is an RFC 2047 encoded word (`=?utf-8?b?…?=@c.com`) passes
no control character, but the email package decodes it when it sets the `To:` header: one
decoding to a line break made `_build` raise a bare ValueError, which the runner took for an
unexpected failure of a request under way, so the item became `unknown` ("may have been
delivered", exit 3, an operator's decision) though nothing left; one decoding to text put
another address in `To:` than the envelope's. An address the channel would refuse fails
the file while planning, with its line, exit 2, nothing stored (smtp_options:
recipient_problem), never an item maybe delivered."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ..conftest import Workspace, smtp_server
from ..support.smtp import Inbox

pytestmark = pytest.mark.timeout(60)
LINE_BREAK = "=?utf-8?b?" + base64.b64encode(b"x\r\nBcc: victim").decode() + "?=@example.com"
OTHER_NAME = "=?utf-8?q?boss?=@example.com"


@pytest.fixture
def inbox(ws: Workspace) -> Any:
    handler = Inbox()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("to", [LINE_BREAK, OTHER_NAME], ids=["line-break", "other-name"])
def test_an_encoded_word_in_to_fails_the_file_never_an_unknown_item(
    ws: Workspace, inbox: Inbox, to: str
) -> None:
    ws.write_csv("mail.csv", [["to"], ["ok@example.com"], [to]])
    result = ws.invoke("send", "mail.csv", "--channel", "mail")
    assert result.exit_code == 2, result.output
    assert "line 3: " in result.output and "line 2: " not in result.output, result.output
    assert inbox.messages == []
    assert not ws.db_file.exists()
