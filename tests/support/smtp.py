"""Real SMTP servers on 127.0.0.1 for the `mail` channel: an inbox keeping what it accepted,
a slow relay noting when each message began, and the scaffolding of a raw peer whose every
byte a test writes (RawSmtpPeer)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from email import message_from_bytes
from email.message import Message
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from .net import free_port
from .workspace import Workspace

HOLD_S = 30.0  # the longest a relay here holds a step for the test


class Inbox:
    """An aiosmtpd handler keeping every message it accepted."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        self.messages.append(message_from_bytes(content))
        return "250 OK"

    def message_ids(self) -> list[str]:
        return [str(m["Message-ID"]) for m in self.messages]


@contextlib.contextmanager
def smtp_server(ws: Workspace, handler: Any, options: str = "", **server: Any) -> Iterator[None]:
    """`handler` as a real SMTP server on 127.0.0.1 (`server`: aiosmtpd's SMTP settings, e.g.
    data_size_limit), and a `mail` channel pointing at it."""
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, **server)
    controller.start()
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {port}\n'
        f'sender = "ops@example.com"\n{options}'
    )
    try:
        yield
    finally:
        controller.stop()


class SlowRelay:
    """An SMTP relay that takes 1 s per message, noting when each MAIL command arrived."""

    def __init__(self) -> None:
        self.mail_times: list[float] = []
        self.first_mail = threading.Event()
        self.seconds = 1.0

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        self.mail_times.append(time.time())
        self.first_mail.set()
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await asyncio.sleep(self.seconds)
        return "250 OK"


class HeldGreeting(Inbox):
    """A relay whose sessions are slow to open: each EHLO is answered only once `expected`
    connections wait at it (so every sender is mid-greeting at once), and only after
    `meanwhile` has run, once (the test's event during the greeting: a window closing, a
    deadline passing). Every message it then accepts is kept, as Inbox does."""

    def __init__(self, expected: int, meanwhile: Callable[[], None]) -> None:
        super().__init__()
        self.expected = expected
        self.meanwhile = meanwhile
        self.waiting = 0
        self.most_waiting = 0  # the most connections that waited at EHLO at once
        self.released = False

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        give_up = time.monotonic() + HOLD_S
        while not self.released and self.waiting < self.expected:
            if time.monotonic() > give_up:
                break
            await asyncio.sleep(0.01)  # a condition polled on the relay's loop, not a delay
        if not self.released:
            self.released = True
            self.meanwhile()
        self.waiting -= 1
        session.host_name = hostname
        return responses


class RawSmtpPeer:
    """A raw SMTP peer on 127.0.0.1 (a free port): each connection served by `serve` on a
    thread of its own, until `stop`. What it says, byte by byte, is the subclass's."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self.serve(conn)

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
