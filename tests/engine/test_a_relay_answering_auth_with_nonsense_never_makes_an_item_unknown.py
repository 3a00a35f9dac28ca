"""The login happens before MAIL FROM: whatever the relay answers to AUTH, no message has
left, so no item may become `unknown` (maybe delivered, an operator's decision) for it
(docs/guarantees.md, SMTP relay answers: greeting, EHLO, STARTTLS, AUTH). A relay answering
AUTH with a `334` challenge that is not base64 made smtplib raise binascii.Error, which the
channel let through: the runner took it for a failure of a request under way and made every
item of the run unknown. At N = 1 and at N = 8."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from ..conftest import Workspace, make_rows
from ..support.smtp import RawSmtpPeer

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


class GarbledChallenge(RawSmtpPeer):
    """A raw SMTP peer on 127.0.0.1 offering AUTH PLAIN LOGIN and answering every AUTH line
    with a 334 whose challenge is not base64; it never gets as far as MAIL."""

    def __init__(self) -> None:
        self.mails = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        conn.sendall(b"220 garbled.example ESMTP\r\n")
        while line := reader.readline():
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250-garbled.example\r\n250 AUTH PLAIN LOGIN\r\n")
            elif verb == b"AUTH":
                conn.sendall(b"334 abc\r\n")
            elif verb == b"MAIL":
                self.mails += 1
                conn.sendall(b"250 ok\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"500 no\r\n")


@pytest.fixture
def relay(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Iterator[GarbledChallenge]:
    server = GarbledChallenge()
    monkeypatch.setenv("SMTP_USER", "alice")
    monkeypatch.setenv("SMTP_PASSWORD", "correct horse")
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {server.port}\n'
        'sender = "ops@example.com"\ntimeout = 5\n'
        'username_env = "SMTP_USER"\npassword_env = "SMTP_PASSWORD"\n'
        "[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
    )
    yield server
    server.stop()


@pytest.mark.parametrize("n", [1, 8])
def test_a_garbled_auth_challenge_leaves_no_item_unknown(
    ws: Workspace, relay: GarbledChallenge, n: int
) -> None:
    """At N = 1 and at N = 8 with more rows than senders (eight logins at once; an SMTP
    relay is never asked, so none is claimed ahead): every item fails, none is unknown."""
    rows = 3 if n == 1 else 2 * n
    ws.write_csv("batch.csv", make_rows(rows))
    sent = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
    assert relay.mails == 0
    states = ws.ledger.states()
    assert states == {f"u{i}": "failed" for i in range(1, rows + 1)}, (states, sent.output)
    assert sent.exit_code == 3, sent.output
