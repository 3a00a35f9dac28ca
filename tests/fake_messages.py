"""A scripted fake of the Messages API on 127.0.0.1, for the real `anthropic` SDK to talk to
(its `base_url` points here through ANTHROPIC_BASE_URL; nothing goes to the network).

It answers from canned responses — per row (the row id is read from the request) or from a
general queue — and otherwise with a well-formed tool call; it records every request."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL_NAME = "notification_draft"


@dataclass(frozen=True)
class Canned:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recorded:
    at: float
    row_id: str
    headers: dict[str, str]
    body: dict[str, Any]


def tool_answer(subject: str, body: str, model: str = "claude-test-1") -> Canned:
    return Canned(
        200,
        {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [
                {"type": "tool_use", "id": "toolu_fake", "name": TOOL_NAME,
                 "input": {"subject": subject, "body": body}}
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 7},
        },
    )  # fmt: skip


def error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Canned:
    return Canned(
        status, {"type": "error", "error": {"type": kind, "message": message}}, headers or {}
    )


def text_only_answer() -> Canned:
    """A malformed answer for our purpose: prose instead of the tool call."""
    return Canned(
        200,
        {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-test-1",
            "content": [{"type": "text", "text": "Sure! Here is a draft: Hello."}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 9},
        },
    )  # fmt: skip


class FakeMessages:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[Canned] = deque()  # answered first, whatever the row
        self.per_row: dict[str, deque[Canned]] = {}
        self.answer_limit: int | None = None  # after this many answers, hold every request
        self.release = threading.Event()
        self._answered = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def rows_requested(self) -> list[str]:
        with self._lock:
            return [r.row_id for r in self.requests]

    def default(self, row: dict[str, Any]) -> Canned:
        return tool_answer(f"Draft {row.get('id')}", f"Dear {row.get('name', 'you')}, hello.")

    def _answer(self, payload: dict[str, Any], headers: dict[str, str]) -> Canned | None:
        """The canned answer for this request, or None to hold it until `release`."""
        row = _row_of(payload)
        row_id = str(row.get("id", ""))
        with self._lock:
            self.requests.append(Recorded(time.monotonic(), row_id, headers, payload))
            hold = self.answer_limit is not None and self._answered >= self.answer_limit
            if not hold:
                self._answered += 1
            queue = self.per_row.get(row_id)
            if hold:
                return None
            if queue:
                return queue.popleft()
            if self.script:
                return self.script.popleft()
        return self.default(row)

    @contextmanager
    def running(self) -> Iterator[FakeMessages]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                canned = fake._answer(payload, headers)
                if canned is None:
                    fake.release.wait(30)
                    canned = error(500, "api_error", "released after hold")
                data = json.dumps(canned.body).encode()
                with suppress(OSError):  # the client may have been killed meanwhile
                    self.send_response(canned.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in canned.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            server.shutdown()
            server.server_close()


def _row_of(payload: dict[str, Any]) -> dict[str, Any]:
    """The recipient row the request is about (compose.py sends it as JSON after a label)."""
    with suppress(KeyError, IndexError, ValueError, TypeError, AttributeError):
        text = payload["messages"][0]["content"]
        if isinstance(text, list):
            text = text[0]["text"]
        row: dict[str, Any] = json.loads(str(text).split("\n", 1)[1])
        return row
    return {}
