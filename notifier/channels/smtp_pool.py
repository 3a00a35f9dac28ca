"""SMTP connections: opening one (TLS, STARTTLS, login), bounding each step, and a pool of
them so that every sender of a run has a connection of its own.

A connection carries one transaction at a time; the pool hands an idle one to a sender (the
most recently used: the likeliest to be still open) or opens a new one, up to
`max_connections` (none set: as many as there are senders at once, which is the run's
--concurrency). A connection goes back to the pool after a transaction that left it clean,
and is closed after anything else. STARTTLS and the login are done per connection.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import smtplib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from notifier.channels import smtp_replies as replies
from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.redact import literal, redacted

_REPLY_CHARS = 200  # how much of a server reply an error message quotes
_QUIT_S = 5.0  # the longest a connection's QUIT is waited for when the pool closes


class _Deadlines:
    """One thread that ends every SMTP step that outlives its deadline, for all the
    watchdogs of the process: a thread started per step would cost a pool of busy senders
    more CPU than building their messages. A step arms a deadline (a heap push) and disarms
    it when done; the thread sleeps until the earliest one, which is woken only when a
    deadline earlier than all others arrives (steps share one timeout, so rarely)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Armed]] = []
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, fire: Callable[[], None]) -> _Armed:
        armed = _Armed(fire)
        deadline = time.monotonic() + seconds
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="smtp-watchdog", daemon=True)
                self._thread.start()
            first = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, next(self._order), armed))
            if first:
                self._cond.notify()
        return armed

    def disarm(self, armed: _Armed) -> None:
        with self._cond:  # under the lock: a deadline never fires for a step that ended
            armed.done = True

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                remaining = self._heap[0][0] - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                armed = heapq.heappop(self._heap)[2]
                armed.done = True
                with contextlib.suppress(Exception):
                    armed.fire()


class _Armed:
    __slots__ = ("done", "fire")

    def __init__(self, fire: Callable[[], None]) -> None:
        self.fire = fire
        self.done = False


_DEADLINES = _Deadlines()


class Watchdog:
    """Bounds each SMTP step as a whole. The socket timeout bounds each read, so a server
    that trickles its reply a byte at a time, or never ends a line, would hold the run for
    as long as it likes; at the step's deadline the connection's socket is shut down, which
    ends the blocked read with a disconnect that the step classifies as usual."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.conn: smtplib.SMTP | None = None
        self.fired = False

    @contextlib.contextmanager
    def step(self, seconds: float | None = None) -> Iterator[None]:
        armed = _DEADLINES.arm(self.seconds if seconds is None else seconds, self._fire)
        try:
            yield
        finally:
            _DEADLINES.disarm(armed)

    def _fire(self) -> None:
        self.fired = True
        sock = getattr(self.conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class Relay:
    """Where and how to connect, and how errors about it read (secrets scrubbed)."""

    name: str
    host: str
    port: int
    use_ssl: bool
    use_starttls: bool
    timeout: float
    username: str | None = None
    password: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    secrets: tuple[str, ...] = ()

    def error(
        self,
        kind: ErrorKind,
        what: str,
        exc: BaseException,
        *,
        fired: bool = False,
        unreachable: bool = False,
    ) -> ChannelError:
        detail = self.scrub(f"{type(exc).__name__}: {exc}")[:_REPLY_CHARS]
        if fired:
            detail = f"no complete answer within {self.timeout:g}s: stalled or trickling"
        return ChannelError(
            kind,
            f"smtp channel {self.name!r}: {self.host}:{self.port}: {what} ({detail})",
            unreachable=unreachable,
        )

    def reply_text(self, reply: bytes) -> str:
        """The reply as an error quotes it: one line, the secrets masked, cut to length, and
        no control character (an escape sequence would act on the operator's terminal)."""
        # Masked before the white space is folded: a secret holding two spaces in a row
        # would no longer be found in the folded line.
        text = " ".join(self.scrub(reply.decode("utf-8", "replace")).split())
        return literal(text[:_REPLY_CHARS])

    def scrub(self, text: str) -> str:
        """Defence in depth: a server that echoes what it was sent must not leak a secret."""
        return redacted(text, self.secrets)


class Session:
    """One slot of the pool: a connection (None until opened, or once dropped) and the
    watchdog that bounds its steps."""

    def __init__(self, timeout: float) -> None:
        self.conn: smtplib.SMTP | None = None
        self.watchdog = Watchdog(timeout)

    def drop(self) -> None:
        """Never reuse this connection (interrupted, closed by the relay, answered nonsense)."""
        conn, self.conn = self.conn, None
        close_quietly(conn)

    def open(self, relay: Relay) -> smtplib.SMTP:
        """A new connection in this slot: greeting, EHLO, STARTTLS and login. Raises a
        classified ChannelError (the slot stays empty)."""
        self.drop()
        self.watchdog.fired = False
        self.conn = _connect(relay, self.watchdog)
        return self.conn


class Pool:
    """Connections to one relay, at most `limit` open at once (None: no limit)."""

    def __init__(self, relay: Relay, limit: int | None) -> None:
        self.relay = relay
        self.limit = limit
        self._idle: list[Session] = []
        self._slots = 0  # sessions handed out or idle
        self._cond = threading.Condition()
        self._closed = False
        self.opened = 0  # connections opened so far (for tests and the bench)

    def checkout(self) -> Session:
        """An idle session (its connection open, most recently used first), else a new
        empty slot while under the limit, else wait for one to come back."""
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self.limit is None or self._slots < self.limit:
                    self._slots += 1
                    return Session(self.relay.timeout)
                self._cond.wait()

    def checkin(self, session: Session) -> None:
        """Back to the pool: kept when its connection is still open (and the pool is not
        closed), else the slot is freed."""
        with self._cond:
            if session.conn is not None and not self._closed:
                self._idle.append(session)
            else:
                self._slots -= 1
                session.drop()
            self._cond.notify()

    def open(self, session: Session) -> smtplib.SMTP:
        """A new connection in `session`'s slot (see Session.open)."""
        conn = session.open(self.relay)
        with self._cond:
            self.opened += 1
        return conn

    def close(self) -> None:
        """QUIT and close every idle connection; one still in use is closed when it comes
        back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._slots -= len(idle)
            self._cond.notify_all()
        for session in idle:
            conn = session.conn
            if conn is None:
                continue
            try:
                # Bounded as every other step (a relay trickling its 221 would hold the
                # command that is done), and shorter: nothing waits on the goodbye.
                with (
                    contextlib.suppress(smtplib.SMTPException, OSError),
                    session.watchdog.step(min(session.watchdog.seconds, _QUIT_S)),
                ):
                    conn.quit()
            finally:
                session.drop()


# ---------------------------------------------------------------------- opening


def _connect(relay: Relay, watchdog: Watchdog) -> smtplib.SMTP:
    # Built per connection, as it reads the trusted certificates where the environment says
    # (SSL_CERT_FILE) now; and only for TLS: it costs a plain session's connect 30 ms of CPU.
    tls = relay.use_ssl or relay.use_starttls
    context = ssl.create_default_context() if tls else None
    conn: smtplib.SMTP | None = None
    try:
        if relay.use_ssl:
            conn = smtplib.SMTP_SSL(timeout=relay.timeout, context=context)
        else:
            conn = smtplib.SMTP(timeout=relay.timeout)
        # Connecting outside the constructor puts the greeting under the watchdog too;
        # the constructor is what normally records the name TLS verifies against.
        conn._host = relay.host  # type: ignore[attr-defined]
        watchdog.conn = conn
        with watchdog.step():
            code, greeting = conn.connect(relay.host, relay.port)
        if code != 220:
            # The relay answered, and not with a welcome (Postfix's `421 4.7.0 too many
            # connections`): its answer, classified like any other, never an EHLO sent to a
            # closing connection and counted as "unreachable".
            raise smtplib.SMTPConnectError(code, greeting)
        # A new session's greeting, EHLO, STARTTLS and login together are one step.
        with watchdog.step():
            _open_session(relay, conn, context)
    except ChannelError:
        close_quietly(conn)
        raise
    except smtplib.SMTPResponseException as exc:  # greeting, HELO or STARTTLS refused
        close_quietly(conn)
        raise _refused_opening(relay, exc, watchdog.fired) from exc
    except ssl.SSLCertVerificationError as exc:
        close_quietly(conn)
        raise relay.error(
            ErrorKind.PERMANENT, "the server's TLS certificate does not verify; check `host`", exc
        ) from exc
    except (smtplib.SMTPException, OSError) as exc:  # refused, DNS, timeout, reset
        close_quietly(conn)
        raise relay.error(
            ErrorKind.NOT_SENT, "cannot connect", exc, fired=watchdog.fired, unreachable=True
        ) from exc
    except Exception as exc:
        # Anything else a greeting, EHLO, STARTTLS or login can raise: before MAIL FROM,
        # so nothing was sent, never an uncertain request.
        close_quietly(conn)
        raise relay.error(
            ErrorKind.NOT_SENT, "could not open a session", exc, fired=watchdog.fired
        ) from None
    return conn


def _refused_opening(relay: Relay, exc: smtplib.SMTPResponseException, fired: bool) -> ChannelError:
    """A greeting, EHLO or STARTTLS answered with an error code. A 421/450/451/452, or any
    4xx greeting, is the relay asking to come back later (THROTTLED: the channel waits); any
    other refused greeting is the relay refusing us (the channel's failure: NOT_SENT,
    unreachable)."""
    code = exc.smtp_code
    kind = replies.kind_of(code)
    if isinstance(exc, smtplib.SMTPConnectError) and 400 <= code < 500:
        kind = ErrorKind.THROTTLED
    if kind is ErrorKind.THROTTLED:
        return relay.error(kind, "the relay asked to try later when connecting", exc, fired=fired)
    if isinstance(exc, smtplib.SMTPConnectError):
        return relay.error(
            ErrorKind.NOT_SENT, "could not open a session", exc, fired=fired, unreachable=True
        )
    return relay.error(kind, "could not open a session", exc, fired=fired)


def _open_session(relay: Relay, conn: smtplib.SMTP, context: ssl.SSLContext | None) -> None:
    conn.ehlo_or_helo_if_needed()
    if relay.use_starttls:
        if not conn.has_extn("starttls"):
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"smtp channel {relay.name!r}: {relay.host}:{relay.port} does not offer "
                "STARTTLS; check host/port, or use ssl = true for implicit TLS",
            )
        conn.starttls(context=context)
        conn.ehlo()
    if relay.username is not None and relay.password is not None:
        _login(relay, conn, relay.username, relay.password)


def _login(relay: Relay, conn: smtplib.SMTP, username: str, password: str) -> None:
    check = f"check ${relay.username_env} and ${relay.password_env}"
    name, host = relay.name, relay.host
    try:
        conn.login(username, password)
    except smtplib.SMTPAuthenticationError as exc:
        if 400 <= exc.smtp_code < 500:
            raise ChannelError(
                replies.kind_of(exc.smtp_code),
                f"smtp channel {name!r}: {host} could not authenticate right now "
                f"(temporary failure {exc.smtp_code})",
            ) from None
        # `from None`: the chained exception would carry the server's reply verbatim.
        raise ChannelError(
            ErrorKind.PERMANENT,
            f"smtp channel {name!r}: {host} refused the login ({exc.smtp_code}); {check}",
        ) from None
    except smtplib.SMTPNotSupportedError:
        raise ChannelError(
            ErrorKind.PERMANENT,
            f"smtp channel {name!r}: {host} does not offer AUTH on this connection (does it "
            "need starttls = true?); or remove username_env",
        ) from None
    except UnicodeEncodeError:
        # smtplib writes AUTH in ASCII; its error names the character and its place in the
        # credentials, a piece of the password. Before MAIL FROM: nothing was sent.
        raise ChannelError(
            ErrorKind.PERMANENT,
            f"smtp channel {name!r}: the username or password holds a character that is not "
            f"ASCII, which SMTP AUTH cannot carry; {check}",
        ) from None
    except ValueError:
        # binascii.Error: a 334 challenge that is not base64. Not quoted (`from None` too):
        # what smtplib says of it may carry the exchange.
        raise ChannelError(
            ErrorKind.PERMANENT,
            f"smtp channel {name!r}: {host} answered the login with a challenge that is not "
            "base64; nothing was sent",
        ) from None
    except smtplib.SMTPServerDisconnected:
        raise
    except smtplib.SMTPResponseException as exc:
        raise ChannelError(
            ErrorKind.PERMANENT if exc.smtp_code >= 500 else replies.kind_of(exc.smtp_code),
            f"smtp channel {name!r}: login failed ({exc.smtp_code}); {check}",
        ) from None
    except smtplib.SMTPException:
        raise ChannelError(
            ErrorKind.PERMANENT,
            f"smtp channel {name!r}: {host} offers no login method smtplib supports "
            "(PLAIN, LOGIN, CRAM-MD5)",
        ) from None


def close_quietly(conn: smtplib.SMTP | None) -> None:
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.close()
