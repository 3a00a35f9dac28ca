"""The SMTP channel's pool of connections, through the real CLI against an
aiosmtpd relay: each sender has a connection of its own and reuses it, a connection the relay
closed is reopened without costing the message anything, `max_connections` caps both the
connections and the items in flight. A kill -9 leaves in flight only the requests that were
really under way: tests/crash/test_smtp_killed_at_n8.py."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from notifier.channels.smtp_pool import Relay, Watchdog, _connect
from notifier.domain.answers import ChannelError, ErrorKind

from ..conftest import Workspace, make_rows
from ..smtp_relay import FAST_RETRY, each_key_once, relay

CONCURRENCY = pytest.mark.parametrize("n", [1, 8])


def _states(ws: Workspace) -> dict[str, int]:
    return ws.ledger.state_counts()


@CONCURRENCY
def test_each_sender_reuses_a_connection_of_its_own(ws: Workspace, n: int) -> None:
    """32 messages at 50 ms each: at most N connections carry them all (reused, never one
    per message), and at N = 8 several are under way at once (not serialised on one)."""
    with relay(ws) as handler:
        handler.delay_s = 0.05
        ws.write_csv("batch.csv", make_rows(32))
        result = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
    assert len(set(handler.peers)) <= n
    assert handler.max_active <= n
    if n > 1:
        assert handler.max_active > 1, "the sends were serialised on one connection"


@CONCURRENCY
@pytest.mark.parametrize("closing", ["after-message", "idle-421"])
def test_a_connection_the_relay_closed_is_reopened_at_no_cost_to_the_message(
    ws: Workspace, n: int, closing: str
) -> None:
    """The relay closes every connection after its message (or answers 421 to the next
    MAIL on it): the next send opens a new connection and succeeds at its first attempt;
    no attempt is recorded as failed or throttled."""
    with relay(ws, FAST_RETRY) as handler:
        handler.close_after_message = closing == "after-message"
        handler.idle_421 = closing == "idle-421"
        ws.write_csv("batch.csv", make_rows(12))
        result = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
    assert [a.outcome for a in ws.ledger.attempts()] == ["sent"] * 12
    assert len(set(handler.peers)) == 12  # a new connection for every message
    if closing == "idle-421":
        assert len(handler.answered) >= 12 - n  # every reused connection was refused once


def test_max_connections_caps_the_connections_and_the_sends_at_once(ws: Workspace) -> None:
    """max_connections = 2 at --concurrency 8: never more than 2 connections nor 2 messages
    under way, and every message arrives once."""
    with relay(ws, "max_connections = 2\n") as handler:
        handler.delay_s = 0.05
        ws.write_csv("batch.csv", make_rows(16))
        result = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", "8")
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
    assert len(set(handler.peers)) <= 2
    assert handler.max_active == 2


def _greeting_server(greeting: bytes) -> tuple[socket.socket, threading.Thread]:
    """A TCP server on 127.0.0.1 that writes `greeting` to each connection and closes it."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.sendall(greeting)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


@pytest.mark.parametrize(
    ("greeting", "kind", "unreachable"),
    [
        (
            b"421 4.7.0 mx.example too many connections from 127.0.0.1\r\n",
            ErrorKind.THROTTLED,
            False,
        ),
        (b"450 4.3.2 try again later\r\n", ErrorKind.THROTTLED, False),
        (b"554 5.7.1 no service for you\r\n", ErrorKind.NOT_SENT, True),
    ],
)
def test_a_greeting_that_is_not_220_is_the_relays_answer(
    greeting: bytes, kind: ErrorKind, unreachable: bool
) -> None:
    """A 4xx greeting (Postfix's 421 at too many connections) is a throttle: the channel's
    gate closes and the item's attempts are not spent on it; it is never "unreachable",
    which counts toward `down_after` and pauses the run as a channel down."""
    server, _ = _greeting_server(greeting)
    relay = Relay("mail", "127.0.0.1", server.getsockname()[1], False, False, timeout=5)
    try:
        with pytest.raises(ChannelError) as raised:
            _connect(relay, Watchdog(5))
    finally:
        server.close()
    assert raised.value.kind is kind
    assert raised.value.unreachable is unreachable
    assert greeting.split()[0].decode() in str(raised.value)
