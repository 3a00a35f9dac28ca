"""E-mail over SMTP (stdlib smtplib), through a pool of connections (smtp_pool.py).

SMTP can neither dedupe by key nor be asked what it holds, so this channel is neither
idempotent nor queryable: a failure once the message data's final dot has been sent, before
the relay answered, is UNCERTAIN and upstream turns it into `unknown` instead of sending
twice. Everything before that point (connect, MAIL, RCPT, the DATA command, the data
itself) is classified from the relay's reply by smtp_replies.py: 421/450/451/452 =
THROTTLED (the channel waits), other 4xx = NOT_SENT (safe to retry), 5xx = PERMANENT, and a
lost connection = NOT_SENT. The Message-ID is derived from the idempotency key, so a human
(or a mailbox search) can still match a delivery to its intent.

Credentials come only from the environment variables the definition names; their values
never appear in a message, a receipt or anything else this module returns.
"""

from __future__ import annotations

import email.policy
import email.utils
import re
import smtplib
from email.headerregistry import HeaderRegistry
from email.message import EmailMessage
from typing import Any

from notifier.channels import smtp_options as settings
from notifier.channels import smtp_replies as replies
from notifier.channels.base import ChannelConfigError, Ready, Withheld, always, go_ahead
from notifier.channels.smtp_options import (
    DEFAULT_TIMEOUT_S,
    SCHEMA,
    capabilities,
    has_control,
    smtp_address,
)
from notifier.channels.smtp_pool import Pool, Relay, Session
from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent, normalise_target

DEFAULT_PORT = 25
DEFAULT_SSL_PORT = 465
DEFAULT_STARTTLS_PORT = 587
# The steps of a transaction after its request left, each bounded by `timeout` (smtp_pool's
# watchdog): MAIL, RCPT, DATA, and the data with its final reply.
SESSION_STEPS = 4
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^[\x21-\x7e]{1,200}$")
_LINE_START_DOT = re.compile(rb"(?m)^\.")
# Printable ASCII, no leading/trailing/double space, no "=?" (which a reader would take for
# an encoded word), no quote, comma or parenthesis (structured headers would rewrite them).
_PLAIN_HEADER = re.compile(r"^(?!.*=\?)(?!.*  )[!#-'*-+\--~](?:[ !#-'*-+\--~]*[!#-'*-+\--~])?$")


class _Headers(HeaderRegistry):
    """The email package's header registry, remembering the class it makes for each header
    name: the stock one builds a new class on every lookup, a large part of what a message
    costs."""

    def __init__(self) -> None:
        super().__init__()
        self._classes: dict[str, type] = {}

    def __getitem__(self, name: str) -> type:
        cls = self._classes.get(name.lower())
        if cls is None:
            cls = self._classes[name.lower()] = super().__getitem__(name)
        return cls


# refold_source="none": the raw headers (validated by _build) go in as they are and stay on one
# line; a folded digest would read back with a leading space. Built once, not per message.
_POLICY = email.policy.SMTP.clone(refold_source="none", header_factory=_Headers())
_UTF8_POLICY = email.policy.SMTPUTF8.clone(refold_source="none", header_factory=_Headers())


class SmtpChannel:
    """Sends each intent as one text/plain UTF-8 message to `intent.target`."""

    def __init__(self, name: str, definition: dict[str, Any]) -> None:
        self.name = name
        where = f"channel {name!r} (smtp)"
        problems = SCHEMA.problems(where, definition)
        if problems:
            raise ChannelConfigError("; ".join(problems))
        self.idempotent, self.queryable, self.thread_safe = capabilities(definition)
        # Most connections (so sends) at once; None: one per sender, the run's concurrency.
        # The runner never has more of this channel's items in flight (claimed) than this.
        self.max_in_flight: int | None = SCHEMA.value(definition, "max_connections")
        # Read by the judge of a failed item (channels of other types lack it: off).
        self.suppress_on_reject: bool = SCHEMA.value(definition, "suppress_on_reject")
        host = definition.get("host")
        if not isinstance(host, str) or not host.strip() or settings.host_problem(host):
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
        # How long after a message left the relay may still take it (evidence.Caps): a
        # not-sent mark waits that long (api/settling.py). The request "leaves" before MAIL
        # FROM (the sender's last check), and each step after it (MAIL, RCPT, DATA, the data
        # with its final reply) may take up to `timeout`: the relay can take the message
        # only once the final dot has come, and this channel would still accept its answer
        # `timeout` after that, so until every step's timeout has run out.
        self.timeout_s = SESSION_STEPS * self.timeout
        self.query_delay_s = 0.0  # a relay cannot be asked

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
        self.pool = Pool(
            Relay(
                name=name,
                host=self.host,
                port=self.port,
                use_ssl=self.use_ssl,
                use_starttls=self.use_starttls,
                timeout=self.timeout,
                username=self._username,
                password=self._password,
                username_env=self._username_env,
                password_env=self._password_env,
                secrets=settings.secret_forms(self._username, self._password),
            ),
            self.max_in_flight,
        )
        self._relay = self.pool.relay

    # ------------------------------------------------------------------ public surface

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        message_id, recipient, data, needs_utf8 = self._build(intent)
        session = self.pool.checkout()
        try:
            session.watchdog.fired = False  # set by a cut-off step, named in the error
            self._transaction(session, intent.target, recipient, data, needs_utf8, ready)
        except (ChannelError, Withheld):
            # Each classification already left the connection clean (RSET) or dropped it;
            # a withheld message never started a transaction: the connection stays usable.
            raise
        except BaseException:
            session.drop()  # interrupted mid-transaction: never reuse that connection
            raise
        finally:
            self.pool.checkin(session)
        return Receipt(receipt_id=message_id, intent_digest=None)

    def query(self, key: str) -> Receipt | None:
        raise ChannelError(
            ErrorKind.UNCERTAIN,
            f"smtp channel {self.name!r} cannot be queried: SMTP offers no way to ask whether "
            f"it holds the message for {key}",
        )

    def close(self) -> None:
        self.pool.close()

    # ------------------------------------------------------------------ the transaction

    def _transaction(
        self,
        session: Session,
        target: str,
        recipient: str,
        data: bytes,
        needs_utf8: bool,
        ready: Ready,
    ) -> None:
        """MAIL, RCPT, DATA, the message, the final reply; returns when it was accepted."""
        conn = self._mail_from(session, needs_utf8, ready, len(data))
        step = session.watchdog.step

        try:
            with step():
                code, reply = conn.rcpt(recipient)
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            session.drop()
            raise self._lost(session, "connection lost at RCPT", exc) from exc
        if code not in (250, 251):
            raise self._refused(session, "RCPT TO", code, reply, target=target)

        try:
            with step():
                code, reply = conn.docmd("DATA")
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            session.drop()
            raise self._lost(session, "connection lost at DATA", exc) from exc
        if code != 354:
            raise self._refused(session, "DATA", code, reply)

        # Until the final dot has left, the relay cannot have accepted the message (RFC
        # 5321 4.1.1.4): a connection lost while the data is being written (sendall failed,
        # so its last bytes, the dot, never left) is NOT_SENT. From the dot on, a lost
        # answer means "maybe delivered".
        dot_sent = False
        try:
            with step():
                conn.send(_dot_stuffed(data))
                dot_sent = True
                code, reply = conn.getreply()
        except (smtplib.SMTPException, OSError) as exc:
            session.drop()
            if not dot_sent:
                raise self._lost(
                    session,
                    "connection lost while the message data was being sent, before its "
                    "final dot: the relay cannot have accepted it",
                    exc,
                ) from exc
            raise self._relay.error(
                ErrorKind.UNCERTAIN,
                "connection lost after the message data was sent, before the server "
                "answered: it may have been delivered",
                exc,
                fired=session.watchdog.fired,
            ) from exc
        if code == 250:
            return
        text = self._relay.reply_text(reply)
        if 400 <= code < 600:
            kind = replies.kind_of(code)
            if code == 421:
                session.drop()
            raise ChannelError(
                kind,
                f"smtp channel {self.name!r}: {self.host} {replies.what(kind)} the end of "
                f"the message data ({code} {text}); {replies.consequence(kind)}",
            )
        session.drop()
        raise ChannelError(
            ErrorKind.UNCERTAIN,
            f"smtp channel {self.name!r}: unexpected final reply {code} {text} from "
            f"{self.host}: the message may have been delivered",
        )

    def _mail_from(
        self, session: Session, needs_utf8: bool, ready: Ready, size: int
    ) -> smtplib.SMTP:
        """Open (or reuse) the session's connection and start a transaction with MAIL FROM.
        A connection the relay closed while it was idle (disconnect, or 421 at MAIL) is
        reopened once: nothing has been accepted at this point, so that is always safe,
        and it is no failure of the message. The sender's last check (`ready`) is asked
        right before each MAIL FROM, once the connection is ready: a greeting, EHLO,
        STARTTLS or login may take seconds, during which a window can close or a deadline
        pass. Where the relay offers SIZE (RFC 1870), MAIL FROM declares the message's size,
        so a relay whose limit it passes refuses it at MAIL, before the data is sent."""
        for attempt in (1, 2):
            reused = session.conn is not None
            conn = session.conn if session.conn is not None else self.pool.open(session)
            options = ["SMTPUTF8"] if needs_utf8 else []
            if conn.has_extn("size"):
                options.append(f"SIZE={size}")
            if needs_utf8 and not conn.has_extn("smtputf8"):
                raise ChannelError(
                    ErrorKind.PERMANENT,
                    f"smtp channel {self.name!r}: {self.host} does not offer SMTPUTF8, which a "
                    "non-ASCII address needs; use an ASCII address or another server",
                )
            retry = reused and attempt == 1
            go_ahead(ready)
            try:
                with session.watchdog.step():
                    code, reply = conn.mail(self._envelope_sender, options)
            except (smtplib.SMTPServerDisconnected, OSError) as exc:
                session.drop()
                if retry:
                    continue
                raise self._lost(session, "connection lost at MAIL", exc) from exc
            if code == 421 and retry:
                session.drop()
                continue
            if code != 250:
                raise self._refused(session, "MAIL FROM", code, reply)
            return conn
        raise AssertionError("unreachable: the second attempt always returns or raises")

    def _lost(self, session: Session, what: str, exc: BaseException) -> ChannelError:
        """The connection broke before the message was complete: nothing was accepted."""
        return self._relay.error(ErrorKind.NOT_SENT, what, exc, fired=session.watchdog.fired)

    def _refused(
        self, session: Session, phase: str, code: int, reply: bytes, *, target: str = ""
    ) -> ChannelError:
        """A refused MAIL/RCPT/DATA command: nothing was accepted. Keep the connection
        usable (RSET) unless the relay is closing it or answered nonsense."""
        text = self._relay.reply_text(reply)
        kind = replies.kind_of(code)
        if code == 421 or not 400 <= code < 600:
            session.drop()
        elif session.conn is not None:
            try:
                with session.watchdog.step():
                    if session.conn.rset()[0] != 250:
                        session.drop()
            except (smtplib.SMTPException, OSError):
                session.drop()
        if phase == "RCPT TO" and replies.rejects_recipient(code, text):
            return ChannelError(
                kind,
                f"smtp channel {self.name!r}: {self.host} permanently rejected the recipient "
                f"at RCPT TO ({code} {text}); nothing was sent, the item fails, and the "
                "address should not be mailed again (it is marked for suppression)",
                suppress_recipient=normalise_target(target),
                suppress_reason=f"{code} {text}",
            )
        if phase == "RCPT TO" and 400 <= code < 500 and code != 421:
            # One recipient's temporary refusal (greylisting, a full or busy mailbox): that
            # item retries after its own backoff; the gate stays open for everyone else. A
            # 421 is the relay closing the session: a throttle of the whole channel.
            return ChannelError(
                ErrorKind.NOT_SENT,
                f"smtp channel {self.name!r}: {self.host} temporarily refused the recipient "
                f"at RCPT TO ({code} {text}); nothing was sent, this message is tried again "
                "after its own backoff while the channel goes on",
            )
        if not 400 <= code < 600:
            return ChannelError(
                kind,
                f"smtp channel {self.name!r}: {self.host} answered {phase} unexpectedly "
                f"({code} {text}); nothing was accepted, the message is sent again later",
            )
        return ChannelError(
            kind,
            f"smtp channel {self.name!r}: {self.host} {replies.what(kind)} {phase} "
            f"({code} {text}); {replies.consequence(kind)}",
        )

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
        unsubscribe = settings.list_unsubscribe(intent.unsubscribe_url, intent.unsubscribe_mailto)
        if isinstance(unsubscribe, str):
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: {unsubscribe}; refusing to put it in a header",
            )
        needs_utf8 = recipient_utf8 or self._sender_utf8
        policy = _UTF8_POLICY if needs_utf8 else _POLICY
        message_id = f"<{key}@{self._message_id_domain}>"
        msg = EmailMessage(policy=policy)
        # A plain short ASCII value goes in raw: what the policy would write for it, byte for
        # byte, without parsing it (the header parser is most of the CPU a message costs,
        # which is what a pool of busy senders runs short of). Anything else is parsed,
        # encoded and folded by the policy.
        for name, value in (
            ("From", self.sender),
            ("To", recipient),
            ("Subject", subject),
            ("Date", email.utils.format_datetime(clock.now())),
            ("Message-ID", message_id),
        ):
            if _PLAIN_HEADER.match(value) and len(name) + 2 + len(value) <= 78:
                msg.set_raw(name, value)
                continue
            try:
                msg[name] = value
            except ValueError as exc:  # an address part the header parser cannot carry
                raise _smuggled(self.name, name, exc) from None
            # The policy decodes RFC 2047 encoded words as it sets a header, and writes what
            # they decode to: `=?utf-8?q?Hi=0D=0ABcc:_x?=` would be a line break on the wire.
            if has_control(str(msg[name])):
                raise _smuggled(self.name, name, None)
        msg.set_raw("X-Notifier-Key", key)
        msg.set_raw("X-Notifier-Intent-Digest", intent.intent_digest)
        for name, value in unsubscribe:
            msg.set_raw(name, value)
        body = intent.body
        # 7bit when it can be, else quoted-printable: never 8bit data to a server that has
        # not offered 8BITMIME.
        msg.set_content(
            body,
            subtype="plain",
            charset="utf-8",
            cte=None if body.isascii() else "quoted-printable",
        )
        try:
            data = msg.as_bytes(policy=policy)
        except (UnicodeError, ValueError) as exc:
            # An encoded word whose bytes are not in its charset decodes to undecodable
            # characters, which the policy may then fail to write (next to a non-ASCII
            # letter, or where it folds). Nothing has been sent: this message never can be.
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {self.name!r}: the message cannot be written "
                f"({type(exc).__name__}: a header holds an encoded word (=?…?=) whose bytes "
                "are not in its charset?); refusing to send",
            ) from None
        return message_id, recipient, data, needs_utf8


# ---------------------------------------------------------------------- helpers


def _smuggled(channel: str, header: str, exc: ValueError | None) -> ChannelError:
    """A header whose value decodes to a control character (an encoded word spelling a line
    break): refused before any network traffic, as a raw one is."""
    why = f" ({exc})" if exc is not None else ""
    return ChannelError(
        ErrorKind.PERMANENT,
        f"smtp channel {channel!r}: the {header} holds an encoded word (=?…?=) that decodes to "
        f"a control character (CR/LF header injection?){why}; refusing to send",
    )


def _dot_stuffed(data: bytes) -> bytes:
    """The DATA payload: leading dots doubled, CRLF-terminated, then the lone dot."""
    stuffed = _LINE_START_DOT.sub(b"..", data)
    if not stuffed.endswith(b"\r\n"):
        stuffed += b"\r\n"
    return stuffed + b".\r\n"
