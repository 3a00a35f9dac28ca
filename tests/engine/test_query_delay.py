"""A 404 from a status query proves "not sent" only once the receiver has had
`query_delay` to commit what an uncertain attempt may have handed it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ..conftest import Workspace, make_rows, wait_for
from ..support.crashed import crash_send

COMMIT_AFTER_S = 1.5  # longer than the client's timeout of 1 s


class SlowReceiver:
    """A non-idempotent receiver that commits a POST only after the client gave up on it and
    after it has answered a status query with 404 (so the early 404 is always seen, however
    soon or late the client asks), and answers GET /status/KEY with 404 until the commit."""

    def __init__(self, *, commits: bool = True) -> None:
        self.deliveries: list[dict[str, Any]] = []
        self.committed: dict[str, str] = {}
        self.answered = 0  # POSTs fully handled (committed, or refused)
        self.said_not_found = threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                key = self.headers["Idempotency-Key"]
                time.sleep(COMMIT_AFTER_S)  # the client has timed out by now
                if not commits:
                    self._reply(500, {"error": "lost it"})
                    receiver.note_answered()
                    return
                receiver.said_not_found.wait(60)
                with receiver.lock:
                    receiver.deliveries.append({"key": key, **json.loads(body)})
                    receiver.committed[key] = self.headers["Notifier-Intent-Digest"]
                self._reply(201, {"id": f"r-{len(receiver.deliveries)}"})
                receiver.note_answered()

            def do_GET(self) -> None:
                key = self.path.rsplit("/", 1)[1]
                with receiver.lock:
                    digest = receiver.committed.get(key)
                if digest is None:
                    self._reply(404, {"error": "no such key"})
                    receiver.said_not_found.set()
                else:
                    self._reply(200, {"id": key, "intent_digest": digest})

            def _reply(self, status: int, document: dict[str, Any]) -> None:
                data = json.dumps(document).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up on this answer: the commit stands anyway

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def keys(self) -> list[str]:
        with self.lock:
            return [d["key"] for d in self.deliveries]

    def note_answered(self) -> None:
        with self.lock:
            self.answered += 1

    def has_answered_every_post_of(self, ws: Workspace) -> bool:
        """Every request the client made (one attempt row each) has been handled here, so
        a second POST, had there been one, has committed too."""
        attempts = len(ws.ledger.attempts())
        with self.lock:
            return self.answered >= attempts


def _configure(ws: Workspace, receiver: SlowReceiver, extra: str = "") -> None:
    (ws.path / "notifier.toml").write_text(
        "[channels.hooks]\n"
        'type = "webhook"\n'
        f'url = "http://127.0.0.1:{receiver.port}/notifications"\n'
        f'status_url = "http://127.0.0.1:{receiver.port}/status/{{key}}"\n'
        "idempotent = false\n"
        "timeout = 1\n"
        "query_delay = 2\n" + extra
    )


@pytest.fixture
def slow_receiver(ws: Workspace) -> Iterator[SlowReceiver]:
    receiver = SlowReceiver()
    receiver.thread.start()
    _configure(ws, receiver)
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def test_late_commit_after_timeout_is_delivered_once_and_reported_sent(
    ws: Workspace, slow_receiver: SlowReceiver
) -> None:
    """A receiver that commits after the client's timeout and its first query gets the row
    exactly once: the 404 of the immediate query does not count before query_delay, the
    later one finds it."""
    ws.write_csv("batch.csv", make_rows(1))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    wait_for(lambda: slow_receiver.has_answered_every_post_of(ws), "every POST answered")
    assert len(slow_receiver.keys()) == 1, slow_receiver.deliveries
    assert result.exit_code == 0, result.output
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == 1
    assert list(ws.ledger.receipt_sources().values()) == ["query"]


def test_resume_after_a_kill_mid_request_waits_for_the_late_commit(
    ws: Workspace, slow_receiver: SlowReceiver
) -> None:
    """Killed after the request left (after-send): `resume` does not take an early 404 as
    "not sent" (counting from started_at + timeout), so the late commit is found, not doubled."""
    ws.write_csv("batch.csv", make_rows(1))
    # The window's send has timed out (1 s) by the time after-send fires; the receiver
    # commits only once it has answered a query with 404, so resume sees 404 first.
    crash_send("after-send:1", db=ws.db, channel="hooks")
    resumed = ws.invoke("resume")
    wait_for(lambda: slow_receiver.has_answered_every_post_of(ws), "every POST answered")
    assert len(slow_receiver.keys()) == 1, slow_receiver.deliveries
    assert resumed.exit_code == 0, resumed.output
    assert list(ws.ledger.states().values()) == ["sent"]


def test_a_receiver_that_never_commits_fails_the_item_after_its_attempts(ws: Workspace) -> None:
    """Waiting for query_delay does not loop forever: with max_attempts = 2 and a receiver
    that times out and never commits, the item fails after exactly two attempts."""
    receiver = SlowReceiver(commits=False)
    receiver.thread.start()
    _configure(ws, receiver, "\n[retry]\nmax_attempts = 2\nbackoff_base = 0.1\n")
    try:
        ws.write_csv("batch.csv", make_rows(1))
        result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
    assert result.exit_code == 3, result.output
    assert [(i.state, i.attempts) for i in ws.ledger.items()] == [("failed", 2)]
