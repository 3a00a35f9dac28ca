"""SmtpChannel against a real SMTP server (aiosmtpd on 127.0.0.1): message shape, session
reuse, header-injection refusal, reply classification, login from environment variables."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from notifier.channels.base import ChannelConfigError
from notifier.channels.smtp import SmtpChannel
from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.intent import Intent, idempotency_key, intent_digest, make_payload

SENDER = "ops@example.com"
USER = "mailer"
PASSWORD = "s3cret-Pa55word"

# aiosmtpd rightly warns about AUTH without TLS; here it is on loopback on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_intent(
    target: str = "alice@example.com",
    subject: str = "Hello",
    body: str = "Body text",
    seq: int = 1,
) -> Intent:
    item_id = f"item-{seq}"
    payload = make_payload(subject, body, {})
    return Intent(
        run_id="run-1",
        seq=seq,
        item_id=item_id,
        channel="mail",
        target=target,
        payload=payload,
        idempotency_key=idempotency_key("run-1", "0123456789abcdef", item_id, target),
        intent_digest=intent_digest("mail", target, payload),
    )


@dataclass
class Received:
    peer: str
    mail_from: str | None
    rcpt_tos: list[str]
    message: EmailMessage


@dataclass
class Recorder:
    """An aiosmtpd handler that stores every message and can be told how to answer."""

    messages: list[Received] = field(default_factory=list)
    rcpt_peers: list[str] = field(default_factory=list)
    rcpt_reply: str | None = None  # e.g. "550 ..." to refuse every recipient
    data_reply: str = "250 OK"  # the final reply after the message data
    data_delay: float = 0.0  # seconds to sit on the final reply (client timeout test)
    last_server: SMTP | None = None

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        self.rcpt_peers.append(str(session.peer))
        if self.rcpt_reply is not None:
            return self.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = (envelope.original_content or b"").replace(b"\r\n", b"\n")  # as a mailbox stores it
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        mail_from = envelope.mail_from
        self.messages.append(
            Received(str(session.peer), mail_from, list(envelope.rcpt_tos), parsed)
        )
        self.last_server = server
        if self.data_delay:
            await asyncio.sleep(self.data_delay)
        return self.data_reply


@dataclass
class Server:
    handler: Recorder
    controller: Controller
    port: int

    def definition(self, **extra: Any) -> dict[str, Any]:
        return {
            "type": "smtp",
            "host": "127.0.0.1",
            "port": self.port,
            "sender": SENDER,
            "timeout": 5,
            **extra,
        }

    def drop_connections(self) -> None:
        """Close the server side of the last session, as an idle timeout would."""
        server = self.handler.last_server
        assert server is not None

        async def close() -> None:
            assert server.transport is not None
            server.transport.close()

        asyncio.run_coroutine_threadsafe(close(), self.controller.loop).result(timeout=5)


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    """Start aiosmtpd servers on free 127.0.0.1 ports; all stop at the end of the test."""
    started: list[Controller] = []

    def start(**smtp_kwargs: Any) -> Server:
        handler = Recorder()
        port = free_port()
        controller = Controller(handler, hostname="127.0.0.1", port=port, **smtp_kwargs)
        controller.start()
        started.append(controller)
        return Server(handler, controller, port)

    yield start
    for controller in started:
        controller.stop()


@pytest.fixture
def server(start_server: Callable[..., Server]) -> Server:
    return start_server()


def _authenticator(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
) -> AuthResult:
    ok = (
        isinstance(auth_data, LoginPassword)
        and auth_data.login == USER.encode()
        and auth_data.password == PASSWORD.encode()
    )
    if ok:
        return AuthResult(success=True)
    # A careless server that echoes what it was given: the channel must not repeat it.
    echoed = auth_data.password.decode() if isinstance(auth_data, LoginPassword) else ""
    return AuthResult(success=False, handled=False, message=f"535 bad password {echoed}")


def test_message_arrives_with_deterministic_headers_and_unicode_round_trip(
    server: Server,
) -> None:
    """A sent intent arrives once with Message-ID <key@sender-domain>, the key and digest
    headers, and a non-ASCII subject and body (including a leading-dot line) intact."""
    subject = "Grüße aus Köln ✓ 日本"
    body = "Hallo Jürgen,\n.this line starts with a dot\nbye 👋"
    intent = make_intent(subject=subject, body=body)
    channel = SmtpChannel("mail", server.definition())
    try:
        receipt = channel.send(intent)
    finally:
        channel.close()

    expected_id = f"<{intent.idempotency_key}@example.com>"
    assert receipt.receipt_id == expected_id
    assert receipt.intent_digest is None
    assert len(server.handler.messages) == 1
    received = server.handler.messages[0]
    assert received.mail_from == SENDER
    assert received.rcpt_tos == ["alice@example.com"]
    msg = received.message
    assert msg["Message-ID"] == expected_id
    assert msg["X-Notifier-Key"] == intent.idempotency_key
    assert msg["X-Notifier-Intent-Digest"] == intent.intent_digest
    assert msg["From"] == SENDER
    assert msg["To"] == "alice@example.com"
    assert msg["Subject"] == subject
    assert msg["Date"] is not None
    assert msg.get_content_type() == "text/plain"
    assert msg.get_content_charset() == "utf-8"
    assert msg.get_content() == body + "\n"


def test_two_sends_share_one_smtp_session(server: Server) -> None:
    """Consecutive sends reuse the same SMTP connection (same client address and port)."""
    channel = SmtpChannel("mail", server.definition())
    try:
        channel.send(make_intent(seq=1))
        channel.send(make_intent(target="bob@example.com", seq=2))
    finally:
        channel.close()
    peers = {m.peer for m in server.handler.messages}
    assert len(server.handler.messages) == 2
    assert len(peers) == 1


def test_a_session_without_tls_builds_no_tls_context(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay without ssl or starttls never needs the CA bundle read (30 ms of CPU for each
    session it opens)."""

    def no_context(*args: object, **kwargs: object) -> ssl.SSLContext:
        raise AssertionError("a TLS context was built for a plain SMTP session")

    monkeypatch.setattr(ssl, "create_default_context", no_context)
    channel = SmtpChannel("mail", server.definition())
    try:
        channel.send(make_intent())
    finally:
        channel.close()
    assert len(server.handler.messages) == 1


def test_idle_session_dropped_by_server_is_reopened_once(server: Server) -> None:
    """When the server closed the idle session, the next send reconnects and succeeds."""
    channel = SmtpChannel("mail", server.definition())
    try:
        channel.send(make_intent(seq=1))
        server.drop_connections()
        channel.send(make_intent(seq=2))
    finally:
        channel.close()
    assert len(server.handler.messages) == 2
    assert server.handler.messages[0].peer != server.handler.messages[1].peer


@pytest.mark.parametrize(
    ("target", "subject"),
    [
        ("alice@example.com", "Hi\r\nBcc: victim@example.com"),
        ("alice@example.com", "Hi\nX-Injected: 1"),
        ("alice@example.com\r\nBcc: victim@example.com", "Hi"),
        ("alice@example.com", "Tab\tand NUL\x00"),
    ],
)
def test_header_injection_is_refused_before_anything_is_sent(
    server: Server, target: str, subject: str
) -> None:
    """A target or subject with CR, LF or another control character is PERMANENT and
    nothing reaches the server (no connection is even opened)."""
    channel = SmtpChannel("mail", server.definition())
    try:
        with pytest.raises(ChannelError) as info:
            channel.send(make_intent(target=target, subject=subject))
        assert info.value.kind is ErrorKind.PERMANENT
        assert channel.pool.opened == 0
    finally:
        channel.close()
    assert server.handler.messages == []
    assert server.handler.rcpt_peers == []


def test_connection_refused_is_not_sent() -> None:
    """A port with nothing listening gives NOT_SENT (nothing left the process)."""
    channel = SmtpChannel(
        "mail", {"host": "127.0.0.1", "port": free_port(), "sender": SENDER, "timeout": 2}
    )
    with pytest.raises(ChannelError) as info:
        channel.send(make_intent())
    assert info.value.kind is ErrorKind.NOT_SENT
    channel.close()


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("550 5.1.1 No such user", ErrorKind.PERMANENT),
        ("451 4.3.0 Try again later", ErrorKind.NOT_SENT),
        ("454 4.7.1 Relay access denied for now", ErrorKind.NOT_SENT),
    ],
)
def test_refused_recipient_is_classified_and_session_stays_usable(
    server: Server, reply: str, kind: ErrorKind
) -> None:
    """RCPT answered 5xx is PERMANENT, any 4xx but 421 NOT_SENT (that recipient's own
    temporary refusal, its item's retry); after RSET the same session delivers the next
    message."""
    channel = SmtpChannel("mail", server.definition())
    try:
        server.handler.rcpt_reply = reply
        with pytest.raises(ChannelError) as info:
            channel.send(make_intent(seq=1))
        assert info.value.kind is kind
        assert reply[:3] in str(info.value)
        assert server.handler.messages == []

        server.handler.rcpt_reply = None
        channel.send(make_intent(seq=2))
    finally:
        channel.close()
    assert len(server.handler.messages) == 1
    assert server.handler.messages[0].peer == server.handler.rcpt_peers[0]


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("554 5.7.1 Message rejected as spam", ErrorKind.PERMANENT),
        ("451 4.7.1 Greylisted, try again", ErrorKind.THROTTLED),
        ("454 4.3.0 Try again", ErrorKind.NOT_SENT),
    ],
)
def test_final_reply_after_data_is_classified(server: Server, reply: str, kind: ErrorKind) -> None:
    """A 5xx final reply after the message data is PERMANENT, a 451 THROTTLED, another 4xx
    NOT_SENT."""
    server.handler.data_reply = reply
    channel = SmtpChannel("mail", server.definition())
    try:
        with pytest.raises(ChannelError) as info:
            channel.send(make_intent())
    finally:
        channel.close()
    assert info.value.kind is kind


def test_lost_final_reply_is_uncertain_and_next_send_starts_clean(server: Server) -> None:
    """A timeout waiting for the final reply after the data is UNCERTAIN (the server did
    get the message); the connection is dropped and the next send opens a new one."""
    server.handler.data_delay = 3.0
    channel = SmtpChannel("mail", server.definition(timeout=0.3))
    try:
        with pytest.raises(ChannelError) as info:
            channel.send(make_intent(seq=1))
        assert info.value.kind is ErrorKind.UNCERTAIN
        assert len(server.handler.messages) == 1  # it did arrive: "maybe delivered"
        assert channel.pool.opened == 1

        server.handler.data_delay = 0.0
        channel.send(make_intent(seq=2))
    finally:
        channel.close()
    assert len(server.handler.messages) == 2
    assert server.handler.messages[0].peer != server.handler.messages[1].peer


def test_non_ascii_local_part_uses_smtputf8(server: Server) -> None:
    """A recipient with a non-ASCII local part is sent with SMTPUTF8 and arrives intact."""
    channel = SmtpChannel("mail", server.definition())
    try:
        channel.send(make_intent(target="jürgen@example.com"))
    finally:
        channel.close()
    assert server.handler.messages[0].rcpt_tos == ["jürgen@example.com"]
    assert server.handler.messages[0].message["To"] == "jürgen@example.com"


def _authenticating(
    start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch, password: str
) -> tuple[Server, SmtpChannel]:
    """A server that requires AUTH, and a channel whose credentials come from the env."""
    server = start_server(authenticator=_authenticator, auth_required=True, auth_require_tls=False)
    monkeypatch.setenv("TEST_SMTP_USER", USER)
    monkeypatch.setenv("TEST_SMTP_PASSWORD", password)
    definition = server.definition(username_env="TEST_SMTP_USER", password_env="TEST_SMTP_PASSWORD")
    return server, SmtpChannel("mail", definition)


def test_login_with_credentials_from_environment(
    start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """username_env/password_env are read from the environment and the login succeeds
    against a server that requires authentication."""
    server, channel = _authenticating(start_server, monkeypatch, PASSWORD)
    try:
        channel.send(make_intent())
    finally:
        channel.close()
    assert len(server.handler.messages) == 1


def test_wrong_password_is_permanent_and_never_echoed(
    start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused login is PERMANENT, names the variables to check, and no exception text
    (nor its chained causes) contains the password, even when the server echoes it."""
    wrong = "wr0ng-Secret-value"
    _server, channel = _authenticating(start_server, monkeypatch, wrong)
    try:
        with pytest.raises(ChannelError) as info:
            channel.send(make_intent())
    finally:
        channel.close()
    assert info.value.kind is ErrorKind.PERMANENT
    assert "TEST_SMTP_USER" in str(info.value)
    assert "TEST_SMTP_PASSWORD" in str(info.value)
    assert wrong not in str(info.value)
    assert wrong not in repr(info.value)
    assert info.value.__cause__ is None


def test_password_echoed_in_a_server_reply_is_scrubbed(
    start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server reply quoted in an error message never carries the password."""
    server, channel = _authenticating(start_server, monkeypatch, PASSWORD)
    server.handler.rcpt_reply = f"550 rejected, your password is {PASSWORD}"
    try:
        with pytest.raises(ChannelError) as info:
            channel.send(make_intent())
    finally:
        channel.close()
    assert info.value.kind is ErrorKind.PERMANENT
    assert "550" in str(info.value)
    assert PASSWORD not in str(info.value)


def test_missing_credentials_variable_is_a_config_error(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset credentials variable fails at construction, naming the variable."""
    monkeypatch.setenv("TEST_SMTP_USER", USER)
    monkeypatch.delenv("TEST_SMTP_PASSWORD_MISSING", raising=False)
    with pytest.raises(ChannelConfigError, match="TEST_SMTP_PASSWORD_MISSING"):
        SmtpChannel(
            "mail",
            server.definition(
                username_env="TEST_SMTP_USER", password_env="TEST_SMTP_PASSWORD_MISSING"
            ),
        )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"ssl": True, "starttls": True}, "exclude each other"),
        ({"port": "25"}, "port"),
        ({"sender": "not an address"}, "sender"),
        ({"username_env": "TEST_SMTP_USER"}, "password_env"),
        (
            {
                "host": "smtp.example.com",
                "username_env": "TEST_SMTP_USER",
                "password_env": "TEST_SMTP_PASSWORD",
            },
            "starttls = true",
        ),
    ],
)
def test_unusable_definition_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], fragment: str
) -> None:
    """Contradictory or malformed settings, and clear-text credentials to a non-loopback
    host, are refused at construction with a message saying what to change."""
    monkeypatch.setenv("TEST_SMTP_USER", USER)
    monkeypatch.setenv("TEST_SMTP_PASSWORD", PASSWORD)
    definition = {"host": "127.0.0.1", "port": 2525, "sender": SENDER, **extra}
    with pytest.raises(ChannelConfigError, match=fragment) as info:
        SmtpChannel("mail", definition)
    assert PASSWORD not in str(info.value)


def test_query_is_uncertain() -> None:
    """SMTP cannot be asked: query raises UNCERTAIN, never returns None."""
    channel = SmtpChannel("mail", {"host": "127.0.0.1", "port": 2525, "sender": SENDER})
    assert channel.idempotent is False
    assert channel.queryable is False
    with pytest.raises(ChannelError) as info:
        channel.query("ntf1-0123")
    assert info.value.kind is ErrorKind.UNCERTAIN
    channel.close()


@pytest.fixture
def trusted_ca(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> trustme.CA:
    """A throwaway CA that the process trusts (via SSL_CERT_FILE), as a real relay's would be."""
    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    return ca


def _server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def test_starttls_then_login_over_the_encrypted_session(
    start_server: Callable[..., Server], trusted_ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With starttls = true the session is upgraded (the server requires it) before the login
    and the message; the certificate is verified."""
    monkeypatch.setenv("SMTP_USER", USER)
    monkeypatch.setenv("SMTP_PASSWORD", PASSWORD)
    server = start_server(
        tls_context=_server_context(trusted_ca),
        require_starttls=True,
        authenticator=_authenticator,
        auth_required=True,
    )
    channel = SmtpChannel(
        "mail",
        server.definition(starttls=True, username_env="SMTP_USER", password_env="SMTP_PASSWORD"),
    )
    try:
        channel.send(make_intent(subject="Über TLS"))
    finally:
        channel.close()
    [received] = server.handler.messages
    assert received.message["Subject"] == "Über TLS"


def test_starttls_with_an_untrusted_certificate_is_refused(
    start_server: Callable[..., Server], trusted_ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose certificate does not verify gets nothing: the send fails permanently
    (a configuration problem) and no message is delivered."""
    server = start_server(tls_context=_server_context(trustme.CA()), require_starttls=True)
    channel = SmtpChannel("mail", server.definition(starttls=True))
    with pytest.raises(ChannelError) as caught:
        channel.send(make_intent())
    channel.close()
    assert caught.value.kind is ErrorKind.PERMANENT
    assert server.handler.messages == []
