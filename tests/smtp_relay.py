"""A scriptable aiosmtpd relay for the SMTP pool, relay-answer and unsubscribe tests: it
keeps every message with the connection it came on, answers MAIL/RCPT/DATA from a script,
can hold each message (latency), counts the transactions under way at once, and can close a
connection the way a relay does (after a message, or with a 421)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message

from aiosmtpd.smtp import SMTP, Envelope, Session

from .conftest import Workspace, smtp_server

# Fast retries, enough of them for a storm: the tests wait on conditions, never on time.
FAST_RETRY = "\n[retry]\nmax_attempts = 10\nbackoff_base = 0.02\nbackoff_max = 0.2\n"


class ScriptedRelay:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.raw: list[bytes] = []
        self.peers: list[str] = []  # the connection each accepted message came on
        self.mail_count = 0
        self.mail_answers: list[str] = []  # answers to the next MAIL commands, then 250
        self.rcpt_answers: dict[str, str] = {}  # recipient -> answer, every time
        self.rcpt_once: list[str] = []  # answers to the next RCPT commands, then 250
        self.answered: list[str] = []  # every scripted (non-250) answer given, in order
        self.close_after_message = False  # close each connection after its 250 to DATA
        self.idle_421 = False  # answer 421 (and close) to a connection's second MAIL
        self._carried: set[str] = set()  # connections that carried a message
        self.delay_s = 0.0  # held before answering the final dot
        self.active = 0
        self.max_active = 0

    def _close_soon(self, server: SMTP) -> None:
        """Close the connection once the answer being sent has gone out."""
        transport = server.transport
        if transport is not None:
            asyncio.get_running_loop().call_soon(transport.close)

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        self.mail_count += 1
        if self.idle_421 and str(session.peer) in self._carried:
            self._carried.discard(str(session.peer))
            self.answered.append("421 4.4.2 Idle too long, closing")
            self._close_soon(server)
            return "421 4.4.2 Idle too long, closing"
        if self.mail_answers:
            answer = self.mail_answers.pop(0)
            self.answered.append(answer)
            if answer.startswith("421"):
                self._close_soon(server)
            return answer
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        answer = self.rcpt_answers.get(address)
        if answer is None and self.rcpt_once:
            answer = self.rcpt_once.pop(0)
        if answer is not None:
            self.answered.append(answer)
            if answer.startswith("421"):
                self._close_soon(server)
            return answer
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.active -= 1
        content = envelope.original_content or b""
        self.raw.append(content)
        self.messages.append(message_from_bytes(content))
        self.peers.append(str(session.peer))
        self._carried.add(str(session.peer))
        if self.close_after_message:
            self._close_soon(server)
        return "250 OK"

    def message_ids(self) -> list[str]:
        return [str(m["Message-ID"]) for m in self.messages]


@contextlib.contextmanager
def relay(ws: Workspace, options: str = "") -> Iterator[ScriptedRelay]:
    """A ScriptedRelay on 127.0.0.1 and a `mail` channel to it (`options` appended to
    notifier.toml after the channel's own settings)."""
    handler = ScriptedRelay()
    with smtp_server(ws, handler, options):
        yield handler


def each_key_once(ws: Workspace, handler: ScriptedRelay) -> bool:
    """Every planned item arrived exactly once, nothing else did."""
    planned = ws.ledger.keys()
    return sorted(handler.message_ids()) == sorted(f"<{k}@example.com>" for k in planned)
