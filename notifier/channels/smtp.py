"""E-mail over SMTP (stdlib smtplib), one session for a whole batch.

SMTP can neither dedupe by key nor be asked what it holds, so this channel is neither
idempotent nor queryable: a failure after the message data has started to travel is
UNCERTAIN and upstream turns it into `unknown` instead of sending twice. Everything before
that point (connect, MAIL, RCPT, the DATA command) is classified from the server's reply:
4xx = NOT_SENT (safe to retry), 5xx = PERMANENT. The Message-ID is derived from the
idempotency key, so a human (or a mailbox search) can still match a delivery to its intent.

Credentials come only from the environment variables the definition names; their values
never appear in a message, a receipt or anything else this module returns.
"""

from __future__ import annotations

import contextlib
import email.policy
import email.utils
import re
import smtplib
import socket
import ssl
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

from .. import clock
from ..intent import Intent
from . import smtp_options as settings
from .base import ChannelConfigError, ChannelError, ErrorKind, Receipt
from .smtp_options import CAPABILITIES, DEFAULT_TIMEOUT_S, SCHEMA, has_control, smtp_address

DEFAULT_PORT = 25
DEFAULT_SSL_PORT = 465
DEFAULT_STARTTLS_PORT = 587
_REPLY_CHARS = 200  # how much of a server reply an error message quotes
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^[\x21-\x7e]{1,200}$")
_LINE_START_DOT = re.compile(rb"(?m)^\.")


class _Watchdog:
    """Bounds each SMTP step as a whole. The socket timeout bounds each read, so a server
    that trickles its reply a byte at a time, or never ends a line, would hold the run for
    as long as it likes; at the step's deadline the session's socket is shut down, which
    ends the blocked read with a disconnect that the step classifies as usual."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.conn: smtplib.SMTP | None = None
        self.fired = False

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        timer = threading.Timer(self.seconds, self._fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _fire(self) -> None:
        self.fired = True
        sock = getattr(self.conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class SmtpChannel:
    """Sends each intent as one text/plain UTF-8 message to `intent.target`."""

    def __init__(self, name: str, definition: dict[str, Any]) -> None:
        self.name = name
        self.idempotent, self.queryable, self.thread_safe = CAPABILITIES
        where = f"channel {name!r} (smtp)"
        problems = SCHEMA.problems(where, definition)
        if problems:
            raise ChannelConfigError("; ".join(problems))
        host = definition.get("host")
        if not isinstance(host, str) or not host.strip() or has_control(host):
            raise ChannelConfigError(f"{where}: set `host` to the SMTP server's name or address.")
        self.host = host.strip()
        self.use_ssl = settings.flag(where, definition, "ssl")
        self.use_starttls = settings.flag(where, definition, "starttls")
        if self.use_ssl and self.use_starttls:
            raise ChannelConfigError(
                f"{where}: `ssl` (implicit TLS, usually port 465) and `starttls` (upgrade, "
                "usually port 587) exclude each other; set only one of them to true."
            )
        default_port = (
            DEFAULT_SSL_PORT
            if self.use_ssl
            else DEFAULT_STARTTLS_PORT
            if self.use_starttls
            else DEFAULT_PORT
        )
        port = definition.get("port", default_port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ChannelConfigError(f"{where}: `port` must be a number from 1 to 65535.")
        self.port = port
        timeout = definition.get("timeout", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ChannelConfigError(f"{where}: `timeout` must be a positive number of seconds.")
        self.timeout = float(timeout)

        sender = definition.get("sender")
        if not isinstance(sender, str) or has_control(sender):
            raise ChannelConfigError(
                f'{where}: set `sender` to the From address, e.g. "ops@example.com".'
            )
        address = email.utils.parseaddr(sender)[1]
        try:
            envelope_sender, sender_utf8 = smtp_address(address)
        except ValueError as exc:
            raise ChannelConfigError(
                f"{where}: `sender` {sender!r} is not a usable e-mail address ({exc}); "
                'write it as "ops@example.com" or "Ops <ops@example.com>".'
            ) from exc
        self.sender = sender.strip()
        self._envelope_sender = envelope_sender
        self._sender_utf8 = sender_utf8
        self._message_id_domain = envelope_sender.rpartition("@")[2]

        self._username_env, self._password_env = settings.credential_names(where, definition)
        self._username: str | None = None
        self._password: str | None = None
        if self._username_env is not None and self._password_env is not None:
            self._username = settings.read_env(where, self._username_env, "username_env")
            self._password = settings.read_env(where, self._password_env, "password_env")
            if not (self.use_ssl or self.use_starttls or settings.is_loopback(self.host)):
                raise ChannelConfigError(
                    f"{where}: refusing to send the credentials from ${self._username_env} / "
                    f"${self._password_env} in clear text to {self.host}; set starttls = true "
                    "(or ssl = true). Plain-text login is allowed only to a loopback host."
                )
        self._secrets = settings.secret_forms(self._username, self._password)

        self._conn: smtplib.SMTP | None = None
        self._lock = threading.Lock()
        self._watchdog = _Watchdog(self.timeout)

    # ------------------------------------------------------------------ public surface

    def send(self, intent: Intent) -> Receipt:
        message_id, recipient, data, needs_utf8 = self._build(intent)
        with self._lock:
            self._watchdog.fired = False  # set by a cut-off step, named in the error
            try:
                self._transaction(recipient, data, needs_utf8)
            except ChannelError:
                raise  # each classification already left the session clean (RSET) or closed
            except BaseException:
                self._drop()  # interrupted mid-transaction: never reuse that session
                raise
        return Receipt(receipt_id=message_id, intent_digest=None)

    def _transaction(self, recipient: str, data: bytes, needs_utf8: bool) -> None:
        """MAIL, RCPT, DATA, the message, the final reply; returns when it was accepted."""
        conn = self._mail_from(needs_utf8)

        try:
            with self._watchdog.step():
                code, reply = conn.rcpt(recipient)
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self._drop()
            raise self._error(ErrorKind.NOT_SENT, "connection lost at RCPT", exc) from exc
        if code not in (250, 251):
            raise self._refused("RCPT TO", code, reply)

        try:
            with self._watchdog.step():
                code, reply = conn.docmd("DATA")
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self._drop()
            raise self._error(ErrorKind.NOT_SENT, "connection lost at DATA", exc) from exc
        if code != 354:
            raise self._refused("DATA", code, reply)

        # From the first byte of the message on, a lost answer means "maybe delivered".
        try:
            with self._watchdog.step():
                conn.send(_dot_stuffed(data))
                code, reply = conn.getreply()
        except (smtplib.SMTPException, OSError) as exc:
            self._drop()
            raise self._error(
                ErrorKind.UNCERTAIN,
                "connection lost after the message data was sent, before the server "
                "answered: it may have been delivered",
                exc,
            ) from exc
        if code == 250:
            return
        text = self._reply_text(reply)
        if 400 <= code < 500:
            if code == 421:
                self._drop()
            raise ChannelError(
                ErrorKind.NOT_SENT,
                f"smtp channel {self.name!r}: {self.host} did not accept the message "
                f"(temporary failure {code} {text})",
            )
        if 500 <= code < 600:
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: {self.host} rejected the message ({code} {text})",
            )
        self._drop()
        raise ChannelError(
            ErrorKind.UNCERTAIN,
            f"smtp channel {self.name!r}: unexpected final reply {code} {text} from "
            f"{self.host}: the message may have been delivered",
        )

    def query(self, key: str) -> Receipt | None:
        raise ChannelError(
            ErrorKind.UNCERTAIN,
            f"smtp channel {self.name!r} cannot be queried: SMTP offers no way to ask whether "
            f"it holds the message for {key}",
        )

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            try:
                with contextlib.suppress(smtplib.SMTPException, OSError):
                    conn.quit()
            finally:
                _close_quietly(conn)

    # ------------------------------------------------------------------ the message

    def _recipient(self, target: str) -> tuple[str, bool]:
        """The envelope recipient (IDN domain as punycode) and whether it needs SMTPUTF8."""
        if has_control(target):
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: the recipient contains a control character "
                "(CR/LF header injection?); refusing to send",
            )
        try:
            return smtp_address(target)
        except ValueError as exc:
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: recipient {target!r} is not a single e-mail "
                f"address ({exc})",
            ) from exc

    def _build(self, intent: Intent) -> tuple[str, str, bytes, bool]:
        """The Message-ID, the envelope recipient, the wire bytes (CRLF, not yet
        dot-stuffed) and whether SMTPUTF8 is needed. Raises PERMANENT, before any network
        traffic, for anything that could smuggle a header."""
        recipient, recipient_utf8 = self._recipient(intent.target)
        subject = intent.subject
        if has_control(subject):
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: the subject contains a control character "
                "(CR/LF header injection?); refusing to send",
            )
        key = intent.idempotency_key
        if not _KEY.match(key) or not _DIGEST.match(intent.intent_digest):
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: the idempotency key or digest is not a plain "
                "ASCII token; refusing to put it in a header",
            )
        needs_utf8 = recipient_utf8 or self._sender_utf8
        # refold_source="none": the two X-Notifier headers go in raw (validated tokens above)
        # and stay on one line; a folded digest would read back with a leading space.
        base_policy = email.policy.SMTPUTF8 if needs_utf8 else email.policy.SMTP
        policy = base_policy.clone(refold_source="none")
        message_id = f"<{key}@{self._message_id_domain}>"
        msg = EmailMessage(policy=policy)
        msg["From"] = self.sender
        msg["To"] = recipient
        msg["Subject"] = subject
        msg["Date"] = email.utils.format_datetime(clock.now())
        msg["Message-ID"] = message_id
        msg.set_raw("X-Notifier-Key", key)
        msg.set_raw("X-Notifier-Intent-Digest", intent.intent_digest)
        body = intent.body
        # 7bit when it can be, else quoted-printable: never 8bit data to a server that has
        # not offered 8BITMIME.
        msg.set_content(
            body,
            subtype="plain",
            charset="utf-8",
            cte=None if body.isascii() else "quoted-printable",
        )
        return message_id, recipient, msg.as_bytes(policy=policy), needs_utf8

    # ------------------------------------------------------------------ the session

    def _mail_from(self, needs_utf8: bool) -> smtplib.SMTP:
        """Open (or reuse) the session and start a transaction with MAIL FROM. A session the
        server dropped while idle (disconnect, or 421 at MAIL) is reopened once: nothing
        has been accepted at this point, so that is always safe."""
        options = ["SMTPUTF8"] if needs_utf8 else []
        for attempt in (1, 2):
            conn, reused = self._session()
            if needs_utf8 and not conn.has_extn("smtputf8"):
                raise ChannelError(
                    ErrorKind.PERMANENT,
                    f"smtp channel {self.name!r}: {self.host} does not offer SMTPUTF8, which a "
                    "non-ASCII address needs; use an ASCII address or another server",
                )
            retry = reused and attempt == 1
            try:
                with self._watchdog.step():
                    code, reply = conn.mail(self._envelope_sender, options)
            except (smtplib.SMTPServerDisconnected, OSError) as exc:
                self._drop()
                if retry:
                    continue
                raise self._error(ErrorKind.NOT_SENT, "connection lost at MAIL", exc) from exc
            if code == 421 and retry:
                self._drop()
                continue
            if code != 250:
                raise self._refused("MAIL FROM", code, reply)
            return conn
        raise AssertionError("unreachable: the second attempt always returns or raises")

    def _session(self) -> tuple[smtplib.SMTP, bool]:
        """The open session (reused=True) or a new one; raises a classified ChannelError."""
        if self._conn is not None:
            return self._conn, True
        self._conn = self._connect()
        return self._conn, False

    def _connect(self) -> smtplib.SMTP:
        context = ssl.create_default_context()
        conn: smtplib.SMTP | None = None
        try:
            if self.use_ssl:
                conn = smtplib.SMTP_SSL(timeout=self.timeout, context=context)
            else:
                conn = smtplib.SMTP(timeout=self.timeout)
            # Connecting outside the constructor puts the greeting under the watchdog too;
            # the constructor is what normally records the name TLS verifies against.
            conn._host = self.host  # type: ignore[attr-defined]
            self._watchdog.conn = conn
            with self._watchdog.step():
                conn.connect(self.host, self.port)
            # A new session's greeting, EHLO, STARTTLS and login together are one step.
            with self._watchdog.step():
                self._open_session(conn, context)
        except ChannelError:
            _close_quietly(conn)
            raise
        except smtplib.SMTPResponseException as exc:  # greeting, HELO or STARTTLS refused
            _close_quietly(conn)
            kind = ErrorKind.PERMANENT if 500 <= exc.smtp_code < 600 else ErrorKind.NOT_SENT
            connect = isinstance(exc, smtplib.SMTPConnectError)  # the relay refused us
            if connect:
                kind = ErrorKind.NOT_SENT
            raise self._error(kind, "could not open a session", exc, unreachable=connect) from exc
        except ssl.SSLCertVerificationError as exc:
            _close_quietly(conn)
            raise self._error(
                ErrorKind.PERMANENT,
                "the server's TLS certificate does not verify; check `host`",
                exc,
            ) from exc
        except (smtplib.SMTPException, OSError) as exc:  # refused, DNS, timeout, reset
            _close_quietly(conn)
            raise self._error(ErrorKind.NOT_SENT, "cannot connect", exc, unreachable=True) from exc
        return conn

    def _open_session(self, conn: smtplib.SMTP, context: ssl.SSLContext) -> None:
        conn.ehlo_or_helo_if_needed()
        if self.use_starttls:
            if not conn.has_extn("starttls"):
                raise ChannelError(
                    ErrorKind.PERMANENT,
                    f"smtp channel {self.name!r}: {self.host}:{self.port} does not offer "
                    "STARTTLS; check host/port, or use ssl = true for implicit TLS",
                )
            conn.starttls(context=context)
            conn.ehlo()
        if self._username is not None and self._password is not None:
            self._login(conn, self._username, self._password)

    def _login(self, conn: smtplib.SMTP, username: str, password: str) -> None:
        check = f"check ${self._username_env} and ${self._password_env}"
        try:
            conn.login(username, password)
        except smtplib.SMTPAuthenticationError as exc:
            if 400 <= exc.smtp_code < 500:
                raise ChannelError(
                    ErrorKind.NOT_SENT,
                    f"smtp channel {self.name!r}: {self.host} could not authenticate right "
                    f"now (temporary failure {exc.smtp_code})",
                ) from None
            # `from None`: the chained exception would carry the server's reply verbatim.
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: {self.host} refused the login "
                f"({exc.smtp_code}); {check}",
            ) from None
        except smtplib.SMTPNotSupportedError:
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: {self.host} does not offer AUTH on this "
                "connection (does it need starttls = true?); or remove username_env",
            ) from None
        except smtplib.SMTPServerDisconnected:
            raise
        except smtplib.SMTPResponseException as exc:
            raise ChannelError(
                ErrorKind.NOT_SENT if 400 <= exc.smtp_code < 500 else ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: login failed ({exc.smtp_code}); {check}",
            ) from None
        except smtplib.SMTPException:
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: {self.host} offers no login method smtplib "
                "supports (PLAIN, LOGIN, CRAM-MD5)",
            ) from None

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        _close_quietly(conn)

    def _refused(self, phase: str, code: int, reply: bytes) -> ChannelError:
        """A refused MAIL/RCPT/DATA command: nothing was accepted. Keep the session usable
        (RSET) unless the server is closing it or answered nonsense."""
        text = self._reply_text(reply)
        if 400 <= code < 500:
            kind = ErrorKind.NOT_SENT
            what = "temporarily refused"
        elif 500 <= code < 600:
            kind = ErrorKind.PERMANENT
            what = "refused"
        else:
            kind = ErrorKind.NOT_SENT
            what = "answered unexpectedly"
        if code == 421 or not 400 <= code < 600:
            self._drop()
        elif self._conn is not None:
            try:
                if self._conn.rset()[0] != 250:
                    self._drop()
            except (smtplib.SMTPException, OSError):
                self._drop()
        return ChannelError(
            kind, f"smtp channel {self.name!r}: {self.host} {what} {phase} ({code} {text})"
        )

    def _error(
        self, kind: ErrorKind, what: str, exc: BaseException, *, unreachable: bool = False
    ) -> ChannelError:
        detail = self._scrub(f"{type(exc).__name__}: {exc}")[:_REPLY_CHARS]
        if self._watchdog.fired:
            detail = f"no complete answer within {self.timeout:g}s: stalled or trickling"
        return ChannelError(
            kind,
            f"smtp channel {self.name!r}: {self.host}:{self.port}: {what} ({detail})",
            unreachable=unreachable,
        )

    def _reply_text(self, reply: bytes) -> str:
        text = " ".join(reply.decode("utf-8", "replace").split())
        return self._scrub(text)[:_REPLY_CHARS]

    def _scrub(self, text: str) -> str:
        """Defence in depth: a server that echoes what it was sent must not leak a secret."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


# ---------------------------------------------------------------------- helpers


def _dot_stuffed(data: bytes) -> bytes:
    """The DATA payload: leading dots doubled, CRLF-terminated, then the lone dot."""
    stuffed = _LINE_START_DOT.sub(b"..", data)
    if not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    return stuffed + b".\r\n"


def _close_quietly(conn: smtplib.SMTP | None) -> None:
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.close()
