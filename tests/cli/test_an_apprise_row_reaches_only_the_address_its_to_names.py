"""An Apprise row reaches the address its `to` names, the one the suppression list knows it
by, or its file is refused. Apprise's e-mail plugins read a recipient loosely: a
`<ann@example.com>` or `"ann@example.com"` as ann@example.com, a `mailto:` or `x:` before
it as a name, whatever follows a domain (`ann@example.com.`, `ann@example.com>`, the
`--p1ai` of a punycode top-level domain) as no part of it, and an apostrophe as the end of a
name: `o'brien@example.com` was mailed to brien@example.com, another person. The suppression
list keys the row's `to` as written, so `<ann@example.com>` was sent to ann@example.com
while she was suppressed. Such a row fails the file while planning (exit 2, its line named,
nothing stored or sent); a bare address is sent to exactly itself."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from ..conftest import Workspace
from ..support.net import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


class Recipients:
    """An aiosmtpd handler noting each accepted message's envelope recipients."""

    def __init__(self) -> None:
        self.rcpt: list[list[str]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.rcpt.append(list(envelope.rcpt_tos))
        return "250 OK"


@pytest.fixture
def inbox(ws: Workspace) -> Iterator[Recipients]:
    handler = Recipients()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    (ws.path / "notifier.toml").write_text(
        '[channels.alerts]\ntype = "apprise"\ntimeout = 10\n'
        f'urls = ["mailto://127.0.0.1:{port}/?from=ops@example.com&to={{to}}&mode=insecure"]\n'
    )
    try:
        yield handler
    finally:
        controller.stop()


@pytest.mark.parametrize(
    "to",
    [
        "<ann@example.com>",
        '"ann@example.com"',
        "mailto:ann@example.com",
        "x:ann@example.com",
        "ann@example.com.",
        "ann@example.com>",
        "ann@example.com]",
        "o'brien@example.com",
        "ann@example.xn--p1ai",
    ],
)
def test_a_to_apprise_would_read_as_another_address_fails_the_file(
    ws: Workspace, inbox: Recipients, to: str
) -> None:
    assert ws.invoke("suppress", "add", "ann@example.com").exit_code == 0
    ws.write_csv("b.csv", [["to", "subject", "body"], ["bob@example.com", "Hi", "B"],
                           [to, "Hi", "B"]])  # fmt: skip
    refused = ws.invoke("send", "b.csv", "--channel", "alerts")
    assert inbox.rcpt == [], (inbox.rcpt, refused.output)
    assert refused.exit_code == 2, refused.output
    assert "line 3: " in refused.output and "line 2: " not in refused.output, refused.output
    assert ws.ledger.runs() == []


def test_a_bare_address_is_sent_to_exactly_itself(ws: Workspace, inbox: Recipients) -> None:
    tos = ["bob@example.com", "first.last+news@mail.example.co.uk", "a_b-c@example.org",
           "Carol@Example.com"]  # fmt: skip
    ws.write_csv("b.csv", [["to", "subject", "body"], *([to, "Hi", "B"] for to in tos)])
    sent = ws.invoke("send", "b.csv", "--channel", "alerts")
    assert sent.exit_code == 0, sent.output
    assert sorted(inbox.rcpt) == sorted([to] for to in tos), inbox.rcpt
