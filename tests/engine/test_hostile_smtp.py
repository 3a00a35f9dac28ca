"""An SMTP server that trickles or stalls cannot hold a run: every step of a session is
bounded as a whole by the channel's `timeout`, and what a cut-off step means for delivery is
classified as usual (nothing sent before the message data, maybe delivered after it)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from ..conftest import Workspace, make_rows
from ..support.smtp import RawSmtpPeer


class HostileSmtp(RawSmtpPeer):
    """A raw SMTP peer on 127.0.0.1: `trickle` sends its greeting one byte at a time, forever;
    `stall` answers normally until the message data, then never answers."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.messages = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        if self.mode == "trickle":
            for byte in b"220 slow.example ESMTP " * 1000:
                if self.stopping.wait(0.2):
                    return
                conn.sendall(bytes([byte]))
            return
        reader = conn.makefile("rb")
        conn.sendall(b"220 stall.example ESMTP\r\n")
        while line := reader.readline():
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 stall.example\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go ahead\r\n")
                while reader.readline() not in (b".\r\n", b""):
                    pass
                self.messages += 1
                self.stopping.wait(60)  # the final reply never comes
                return
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"250 ok\r\n")


@pytest.fixture(params=["trickle", "stall"])
def hostile(ws: Workspace, request: pytest.FixtureRequest) -> Iterator[HostileSmtp]:
    server = HostileSmtp(request.param)
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {server.port}\n'
        'sender = "ops@example.com"\ntimeout = 1\n'
        "[retry]\nmax_attempts = 2\nbackoff_base = 0.05\nbackoff_max = 0.1\n"
    )
    yield server
    server.stop()


def test_a_trickling_or_stalled_smtp_server_cannot_hang_the_run(
    ws: Workspace, hostile: HostileSmtp
) -> None:
    """With timeout = 1 the run ends in seconds, not minutes: a greeting that never completes
    means nothing was sent and the relay is down (the run pauses, every item pending, none
    failed); a final reply that never comes means maybe delivered (unknown, never re-sent)."""
    ws.write_csv("batch.csv", make_rows(3))
    started = time.monotonic()
    result = ws.invoke("send", "batch.csv", "--channel", "mail")
    elapsed = time.monotonic() - started
    assert result.exit_code == 3, result.output
    assert elapsed < 30, f"the run took {elapsed:.1f}s against a {hostile.mode} server"
    states = [i.state for i in ws.ledger.items()]
    if hostile.mode == "trickle":
        assert states == ["pending"] * 3
        assert ws.ledger.run().state == "paused"
        errors = [a.error for a in ws.ledger.attempts()]
        assert len(errors) == 5 and all("stalled or trickling" in str(e) for e in errors)
    else:
        assert states == ["unknown"] * 3
        assert hostile.messages == 3  # each message left once and was never re-sent
