"""A trickling or stalled SMTP relay cannot hold a run (docs/guarantees.md, A hostile world):
every step of a session is bounded as a whole by the channel's `timeout`. So is the QUIT the
channel sends each idle connection when the command is done: a relay that answers every
message at once but trickles its `221` one byte at a time (each byte within the socket's
timeout) held `send` after its last message for as long as it went on, the run completed
and its command never ending."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import Workspace, make_rows
from ..support.smtp import RawSmtpPeer

pytestmark = pytest.mark.timeout(90)
BOUND_S = 30.0  # the command, with timeout = 1, ends in about a second once QUIT is bounded


class TricklingGoodbye(RawSmtpPeer):
    """A raw SMTP peer on 127.0.0.1 that accepts every message, then answers QUIT a byte
    every 0.2 s, without end, until stopped."""

    def __init__(self) -> None:
        self.messages = 0
        self.quits = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        conn.sendall(b"220 slowbye.example ESMTP\r\n")
        while line := reader.readline():
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 slowbye.example\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go ahead\r\n")
                while reader.readline() not in (b".\r\n", b""):
                    pass
                self.messages += 1
                conn.sendall(b"250 2.0.0 queued\r\n")
            elif verb == b"QUIT":
                self.quits += 1
                for byte in b"221 2.0.0 goodbye " * 1000:
                    if self.stopping.wait(0.2):
                        return
                    conn.sendall(bytes([byte]))
                return
            else:
                conn.sendall(b"250 ok\r\n")


@pytest.fixture
def relay(ws: Workspace) -> Iterator[TricklingGoodbye]:
    server = TricklingGoodbye()
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {server.port}\n'
        'sender = "ops@example.com"\ntimeout = 1\n'
    )
    yield server
    server.stop()


@pytest.mark.parametrize("n", [1, 4])
def test_a_relay_trickling_its_quit_reply_cannot_hold_the_command(
    ws: Workspace, relay: TricklingGoodbye, n: int
) -> None:
    ws.write_csv("batch.csv", make_rows(4))
    results: list[Any] = []
    command = threading.Thread(
        target=lambda: results.append(
            ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
        ),
        daemon=True,
    )
    command.start()
    command.join(BOUND_S)
    held = command.is_alive()
    relay.stop()  # lets a held command end, so the workspace can be torn down
    command.join(BOUND_S)
    assert not held, f"send still runs {BOUND_S:g}s on, the relay trickling its QUIT reply"
    (result,) = results
    assert result.exit_code == 0, result.output
    assert relay.messages == 4 and relay.quits >= 1
