"""SMTP relay answers, classified (docs/guarantees.md "SMTP relay answers"), through
the real CLI against an aiosmtpd relay: 421/450/451/452 pause the channel and are never an
item's failure; a 421 or a lost connection before the final dot is not sent; 550/551/553 with
5.1.x at RCPT fails that item and marks the recipient for suppression."""

from __future__ import annotations

import socket
import threading
import tomllib
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace

import pytest

from notifier.channels.smtp import SmtpChannel
from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.intent import Intent, idempotency_key, intent_digest, make_payload

from ..conftest import Workspace, make_rows
from ..smtp_relay import FAST_RETRY, ScriptedRelay, each_key_once, relay
from ..support.smtp import smtp_server

CONCURRENCY = pytest.mark.parametrize("n", [1, 8])


def _outcomes(ws: Workspace) -> list[str]:
    return [str(a.outcome) for a in ws.ledger.attempts()]


@pytest.mark.both_stores
@CONCURRENCY
def test_451_storm_pauses_the_channel_then_delivers_everything_once(ws: Workspace, n: int) -> None:
    """Three 451 answers to MAIL (the relay's: each recorded `throttled`, the channel's gate
    closes) and three 4xx to RCPT (each that recipient's: `not_sent`, its own retry), no
    item fails, and then every item arrives exactly once (exit 0)."""
    with relay(ws, FAST_RETRY) as handler:
        handler.mail_answers = ["451 4.7.1 Slow down"] * 3
        handler.rcpt_once = [
            "451 4.7.1 Rate limited, try later",
            "452 4.5.3 Too many recipients",
            "450 4.2.1 Busy",
        ]
        ws.write_csv("batch.csv", make_rows(12))
        result = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
    # Besides: items claimed as the gate closed, held back unsent ("not_started").
    outcomes = [o for o in _outcomes(ws) if o != "not_started"]
    assert outcomes.count("throttled") == 3, outcomes
    assert outcomes.count("not_sent") == 3, outcomes
    assert outcomes.count("sent") == 12 and len(outcomes) == 18, outcomes
    assert set(ws.ledger.states().values()) == {"sent"}


@CONCURRENCY
def test_421_before_data_is_retried_and_delivered_once(ws: Workspace, n: int) -> None:
    """A 421 to RCPT (the relay closing the connection) is not sent: the item is tried again
    on a new connection and arrives once; the 421 is throttled, never the item's failure."""
    with relay(ws, FAST_RETRY) as handler:
        handler.rcpt_once = ["421 4.3.2 Shutting down, try later"]
        ws.write_csv("batch.csv", make_rows(5))
        result = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
        assert handler.answered == ["421 4.3.2 Shutting down, try later"]
    outcomes = [o for o in _outcomes(ws) if o != "not_started"]  # held back by the gate
    assert sorted(outcomes) == ["sent"] * 5 + ["throttled"]


def test_rcpt_5_1_1_fails_that_item_only_with_the_recipient_marked(ws: Workspace) -> None:
    """A 550 5.1.1 for one recipient fails that item at its first attempt (never retried)
    with the rejection in its error; the other items are delivered; exit 3."""
    with relay(ws, FAST_RETRY) as handler:
        handler.rcpt_answers = {"user3@example.com": "550 5.1.1 <user3@example.com>: no such user"}
        ws.write_csv("batch.csv", make_rows(5))
        result = ws.invoke("send", "batch.csv", "--channel", "mail")
        assert result.exit_code == 3, result.output
        assert len(handler.messages) == 4
    states = {i.seq: i.state for i in ws.ledger.items()}
    attempts = ws.ledger.attempts()
    assert [(a.seq, states[a.seq]) for a in attempts] == [
        (1, "sent"), (2, "sent"), (3, "failed"), (4, "sent"), (5, "sent")]  # fmt: skip
    outcome, error = attempts[2].outcome, attempts[2].error or ""
    assert outcome == "permanent"
    assert "permanently rejected the recipient" in error and "550 5.1.1" in error


# ---------------------------------------------------------------------- the channel's marker


def _intent(target: str = "Ann@Example.COM", seq: int = 1) -> Intent:
    payload = make_payload("Hello", "Body", {})
    return Intent(
        run_id="run-1",
        seq=seq,
        item_id=f"i{seq}",
        channel="mail",
        target=target,
        payload=payload,
        idempotency_key=idempotency_key("run-1", "0123456789abcdef", f"i{seq}", target),
        intent_digest=intent_digest("mail", target, payload),
    )


@pytest.mark.parametrize(
    ("answer", "kind", "marked"),
    [
        ("550 5.1.1 No such user", ErrorKind.PERMANENT, True),
        ("551 5.1.6 User has moved", ErrorKind.PERMANENT, True),
        ("553 5.1.3 Bad address syntax", ErrorKind.PERMANENT, True),
        ("550 5.7.1 Relaying denied", ErrorKind.PERMANENT, False),  # policy, not the address
        ("550 Mailbox unavailable", ErrorKind.PERMANENT, False),  # no enhanced code
        ("553 5.1.7 Bad sender address", ErrorKind.PERMANENT, False),  # the sender's
        ("554 5.1.1 No such user", ErrorKind.PERMANENT, False),  # not 550/551/553
        # A 4xx at RCPT is that recipient's (greylisting, a full mailbox): the item's own
        # retry, the channel's gate left open; a 421 is the relay closing: a throttle.
        ("451 4.1.1 Try later", ErrorKind.NOT_SENT, False),
        ("452 4.2.2 Mailbox full", ErrorKind.NOT_SENT, False),
        ("450 4.2.1 Mailbox busy", ErrorKind.NOT_SENT, False),
        ("421 4.3.2 Shutting down", ErrorKind.THROTTLED, False),
        ("454 4.7.0 Not now", ErrorKind.NOT_SENT, False),
    ],
)
def test_rcpt_answer_kind_and_suppression_marker(
    ws: Workspace, answer: str, kind: ErrorKind, marked: bool
) -> None:
    """Each RCPT answer's kind, and the suppression marker (the normalised recipient and
    the reply as reason) only for 550/551/553 with a 5.1.x about the destination."""
    with relay(ws) as handler:
        handler.rcpt_once = [answer]
        definition = tomllib.loads((ws.path / "notifier.toml").read_text())["channels"]["mail"]
        channel = SmtpChannel("mail", {**definition, "timeout": 5})
        try:
            with pytest.raises(ChannelError) as info:
                channel.send(_intent())
        finally:
            channel.close()
    error = info.value
    assert error.kind is kind
    if marked:
        assert error.suppress_recipient == "Ann@example.com"
        assert error.suppress_reason == answer
    else:
        assert error.suppress_recipient is None and error.suppress_reason is None


class _DropsMidData:
    """A raw SMTP peer that accepts everything up to DATA, reads a little of the message
    and then closes: the final dot can never have reached it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed_mid_data = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with suppress(OSError):
            conn, _ = self.listener.accept()
            with conn:
                reader = conn.makefile("rb")
                conn.sendall(b"220 drop.example ESMTP\r\n")
                while line := reader.readline():
                    verb = line[:4].upper()
                    if verb == b"DATA":
                        conn.sendall(b"354 go ahead\r\n")
                        reader.read(1024)
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                        self.closed_mid_data.set()
                        return  # closed with a reset, the rest of the data unread
                    conn.sendall(b"250 ok\r\n")

    def stop(self) -> None:
        self.listener.close()


@pytest.fixture
def drops_mid_data() -> Iterator[_DropsMidData]:
    peer = _DropsMidData()
    yield peer
    peer.stop()


def test_connection_lost_before_the_final_dot_is_not_sent(drops_mid_data: _DropsMidData) -> None:
    """A relay that drops the connection while a large message is still being written: the
    final dot never left, so the relay cannot have accepted it: NOT_SENT, not UNCERTAIN."""
    channel = SmtpChannel(
        "mail",
        {"host": "127.0.0.1", "port": drops_mid_data.port, "sender": "ops@example.com",
         "timeout": 10},
    )  # fmt: skip
    lines = ("x" * 70 + "\n") * (256 * 1024)  # 18 MiB: far more than the socket buffers
    big = replace(_intent(), payload=make_payload("Big", lines, {}))
    try:
        with pytest.raises(ChannelError) as info:
            channel.send(big)
    finally:
        channel.close()
    assert drops_mid_data.closed_mid_data.is_set()
    assert info.value.kind is ErrorKind.NOT_SENT, str(info.value)
    assert "before its final dot" in str(info.value)


def test_mail_from_declares_the_size_so_a_message_too_big_is_refused_before_its_data(
    ws: Workspace,
) -> None:
    """Where the relay offers SIZE (RFC 1870), MAIL FROM declares the message's size: one
    over the relay's limit is refused at MAIL (552, the item fails) and its data is never
    sent; one under it goes, its MAIL carrying SIZE=."""
    handler = ScriptedRelay()
    with smtp_server(ws, handler, data_size_limit=4000):
        ws.write_csv("b.csv", [["id", "to", "subject", "body"],
                               ["big", "ann@example.com", "Big", "x" * 20_000],
                               ["small", "bob@example.com", "Small", "hello"]])  # fmt: skip
        result = ws.invoke("send", "b.csv", "--channel", "mail")
        assert result.exit_code == 3, result.output
        assert [m["To"] for m in handler.messages] == ["bob@example.com"]
        assert len(handler.raw) == 1  # the big message's data never left
    assert ws.ledger.states() == {"big": "failed", "small": "sent"}
    error = ws.ledger.item("big").last_error or ""
    assert "MAIL FROM (552" in error, error
