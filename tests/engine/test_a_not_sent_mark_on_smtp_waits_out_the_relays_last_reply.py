"""A `not-sent` mark proves nothing while the receiver may still commit the request
(docs/guarantees.md, "A `not-sent` mark waits out the receiver's window"). An SMTP relay can
take a message only once its data's final dot has arrived, and the channel itself waits
`timeout` for the relay's answer to it (each step of the session is bounded by `timeout`:
MAIL, RCPT, DATA, the data and its final reply). So a relay that was slow at MAIL and RCPT
and lost the connection right after the dot may still commit the message until `timeout`
after the dot, seconds after `timeout` from the moment the request left (before MAIL FROM):
a not-sent mark taken then sends the message a second time."""

from __future__ import annotations

import asyncio
import threading
import time
from email import message_from_bytes

import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from ..conftest import Workspace, make_rows, smtp_server

pytestmark = pytest.mark.timeout(90)

TIMEOUT_S = 2.0


class SlowThenCutRelay:
    """Slow at MAIL and RCPT (each step inside the channel's timeout), then, once the final
    dot has come, closes the connection without an answer and commits the message a moment
    later (when released, or at the latest 0.9 timeout after the dot: inside the time the
    channel would itself have waited for its answer). Once `normal` is set, an ordinary
    relay."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.release = threading.Event()
        self.normal = False
        self.dot_at: float | None = None
        self.committed_at: float | None = None

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, options: list[str]) -> str:  # fmt: skip
        if not self.normal:
            await asyncio.sleep(0.8 * TIMEOUT_S)
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, options: list[str]) -> str:  # fmt: skip
        if not self.normal:
            await asyncio.sleep(0.8 * TIMEOUT_S)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        message = message_from_bytes(envelope.original_content or b"")
        if self.normal:
            self.ids.append(str(message["Message-ID"]))
            return "250 OK"
        self.dot_at = time.monotonic()
        # The commit goes on apart from the connection, which is lost before the answer
        # (the session's task is cancelled with it).
        threading.Thread(target=self._commit, args=(message, self.dot_at), daemon=True).start()
        if server.transport is not None:
            server.transport.close()
        await asyncio.sleep(TIMEOUT_S)  # never answered: the connection is gone
        return "250 OK"

    def _commit(self, message: object, dot_at: float) -> None:
        self.release.wait(0.9 * TIMEOUT_S)
        self.committed_at = time.monotonic()
        self.ids.append(str(message["Message-ID"]))  # type: ignore[index]


def test_a_not_sent_mark_on_smtp_is_refused_until_timeout_after_the_final_dot(
    ws: Workspace,
) -> None:
    handler = SlowThenCutRelay()
    with smtp_server(ws, handler, f"timeout = {TIMEOUT_S}\n"):
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "mail", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u1").state == "unknown"
        # Following the advice at once: the relay has not committed the message yet, and it
        # still may (the channel would have waited `timeout` after the dot for its answer).
        marked = ws.invoke("reconcile", "--manual", "r1", "--item", "u1", "--mark", "not-sent",
                           "--evidence", "not in the mailbox")  # fmt: skip
        marked_at = time.monotonic()
        handler.release.set()
        deadline = time.monotonic() + 30
        while handler.committed_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handler.dot_at is not None and handler.committed_at is not None
        # The mark came while the relay could still commit: inside `timeout` after the dot.
        assert marked_at < handler.dot_at + TIMEOUT_S, "the test was too slow to show it"
        handler.normal = True
        if marked.exit_code != 4:
            ws.invoke("resume", "r1")  # what the accepted mark promises: sent once more
        assert marked.exit_code == 4, (marked.output, handler.ids)
        assert "may still commit" in marked.output
    assert len(handler.ids) == 1, handler.ids
