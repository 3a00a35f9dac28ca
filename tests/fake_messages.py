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
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The API key the tests' environment holds for the fake (never a real one).
KEY = "sk-ant-test-0123456789"
TOOL_NAME = "notification_draft"


@dataclass(frozen=True)
class Canned:
    status: int
    body: Any  # a JSON document (an object, or anything else a broken server answers)
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
        self.unknown_models: set[str] = set()  # 404 from the Models and Messages APIs
        self.echo_model = False  # answer with the model asked for (else claude-test-1)
        self.model_lookups: list[str] = []
        self.http_calls = 0  # every HTTP request the fake answered
        self.release = threading.Event()
        self.held = 0  # requests held now, waiting for `release`
        self.answer_held = False  # once released, answer held requests as usual (else 500)
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

    def default(self, row: dict[str, Any], model: str = "claude-test-1") -> Canned:
        return tool_answer(
            f"Draft {row.get('id')}", f"Dear {row.get('name', 'you')}, hello.", model
        )

    def model_answer(self, model: str) -> Canned:
        """GET /v1/models/{model}: the Models API."""
        with self._lock:
            self.model_lookups.append(model)
        if model in self.unknown_models:
            return error(404, "not_found_error", f"model: {model}")
        return Canned(
            200,
            {"type": "model", "id": model, "display_name": model,
             "created_at": "2025-01-01T00:00:00Z"},
        )  # fmt: skip

    def _answer(self, payload: dict[str, Any], headers: dict[str, str]) -> Canned | None:
        """The canned answer for this request, or None to hold it until `release`."""
        row = _row_of(payload)
        row_id = str(row.get("id", ""))
        model = str(payload.get("model", ""))
        if model in self.unknown_models:
            with self._lock:
                self.requests.append(Recorded(time.monotonic(), row_id, headers, payload))
            return error(404, "not_found_error", f"model: {model}")
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
        return self.default(row, model if self.echo_model else "claude-test-1")

    def _hold(self, payload: dict[str, Any]) -> Canned:
        """A held request's answer once `release` is set: the usual draft with
        `answer_held`, else a 500."""
        with self._lock:
            self.held += 1
        try:
            self.release.wait(30)
        finally:
            with self._lock:
                self.held -= 1
        if self.answer_held:
            return self.default(_row_of(payload))
        return error(500, "api_error", "released after hold")

    def on_get(self, path: str) -> Canned:
        """GET outside /v1/models: the batch endpoints (FakeBatches) answer these."""
        return error(404, "not_found_error", f"no such path: {path}")

    def on_post(self, path: str, payload: dict[str, Any]) -> Canned:
        return error(404, "not_found_error", f"no such path: {path}")

    @contextmanager
    def running(self) -> Iterator[FakeMessages]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.http_calls += 1
                path = self.path.split("?", 1)[0]
                if path.startswith("/v1/models/"):
                    self._reply(fake.model_answer(path.removeprefix("/v1/models/")))
                    return
                self._reply(fake.on_get(self.path))

            def do_POST(self) -> None:
                fake.http_calls += 1
                length = int(self.headers.get("content-length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                if self.path.split("?", 1)[0] != "/v1/messages":
                    self._reply(fake.on_post(self.path, payload))
                    return
                canned = fake._answer(payload, headers)
                if canned is None:
                    canned = fake._hold(payload)
                self._reply(canned)

            def _reply(self, canned: Canned) -> None:
                data = (
                    canned.body["jsonl"].encode()
                    if "jsonl" in canned.body
                    else json.dumps(canned.body).encode()
                )
                with suppress(OSError):  # the client may have been killed meanwhile
                    self.send_response(canned.status)
                    kind = "application/binary" if "jsonl" in canned.body else "application/json"
                    self.send_header("content-type", kind)
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


class FakeBatches(FakeMessages):
    """FakeMessages with the Message Batches endpoints: create, retrieve, list (newest first,
    paginated by after_id), results as JSON Lines, cancel. Scripted: how many polls a batch
    stays in progress, rows whose next batch result expires or errors, answers to `retrieve`
    (a 429 with retry-after), batches of someone else's made beforehand."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []  # creation order
        self.polls_in_progress = 1  # retrieves answered in_progress before a batch ends
        self.expire_once: set[str] = set()  # row ids: their next batch result expires
        self.error_once: dict[str, tuple[str, str]] = {}  # row id: (error type, message)
        self.retrieve_script: deque[Canned] = deque()
        self.retrieved_at: list[float] = []
        self.succeeded: list[str] = []  # row ids, once per succeeded result produced
        self.cancelled: list[str] = []
        self.cancel_status: int | None = None  # set: every cancel is answered this error

    def created(self) -> list[str]:
        with self._lock:
            return list(self.order)

    def add_foreign(self, custom_ids: list[str]) -> str:
        """A batch someone else created, ended, with these custom_ids."""
        requests = [
            {"custom_id": c, "params": {"model": "m", "messages": [], "max_tokens": 1}}
            for c in custom_ids
        ]
        batch_id = self._make(requests)
        with self._lock:
            self.order.remove(batch_id)
            self.batches[batch_id]["polls"] = 10**6
        return batch_id

    def _make(self, requests: list[dict[str, Any]]) -> str:
        with self._lock:
            batch_id = f"msgbatch_{len(self.batches) + 1:04d}"
            self.batches[batch_id] = {
                "id": batch_id,
                "requests": requests,
                "created_at": datetime.now(UTC).isoformat(),
                "polls": 0,
                "results": None,
                "cancel": False,
            }
            self.order.append(batch_id)
            return batch_id

    def _view(self, batch_id: str) -> dict[str, Any]:
        batch = self.batches[batch_id]
        ended = batch["results"] is not None
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        if ended:
            for line in batch["results"]:
                counts[line["result"]["type"]] += 1
        else:
            counts["processing"] = len(batch["requests"])
        status = "ended" if ended else "canceling" if batch["cancel"] else "in_progress"
        return {
            "id": batch_id, "type": "message_batch", "processing_status": status,
            "request_counts": counts, "created_at": batch["created_at"],
            "expires_at": batch["created_at"], "ended_at": batch["created_at"] if ended else None,
            "cancel_initiated_at": None, "archived_at": None,
            "results_url": f"{self.url}/v1/messages/batches/{batch_id}/results" if ended else None,
        }  # fmt: skip

    def _end(self, batch_id: str) -> None:
        """Every request's result, decided once (under the lock)."""
        batch = self.batches[batch_id]
        lines = []
        for request in batch["requests"]:
            row = _row_of(request["params"])
            row_id = str(row.get("id", ""))
            result: dict[str, Any]
            if batch["cancel"]:
                result = {"type": "canceled"}
            elif row_id in self.expire_once:
                self.expire_once.discard(row_id)
                result = {"type": "expired"}
            elif row_id in self.error_once:
                kind, message = self.error_once.pop(row_id)
                result = {"type": "errored", "error": {"type": "error",
                          "error": {"type": kind, "message": message}}}  # fmt: skip
            else:
                queue = self.per_row.get(row_id)
                model = str(request["params"].get("model", ""))
                canned = (
                    queue.popleft()
                    if queue
                    else self.default(row, model if self.echo_model else "claude-test-1")
                )
                result = {"type": "succeeded", "message": canned.body}
                self.succeeded.append(row_id)
            lines.append({"custom_id": request["custom_id"], "result": result})
        batch["results"] = lines

    def on_post(self, path: str, payload: dict[str, Any]) -> Canned:
        if path == "/v1/messages/batches":
            batch_id = self._make(list(payload["requests"]))
            with self._lock:
                return Canned(200, self._view(batch_id))
        parts = path.strip("/").split("/")
        if len(parts) == 5 and parts[4] == "cancel" and parts[3] in self.batches:
            if self.cancel_status is not None:
                return error(self.cancel_status, "api_error", "scripted cancel failure")
            with self._lock:
                self.cancelled.append(parts[3])
                batch = self.batches[parts[3]]
                if batch["results"] is None:
                    batch["cancel"] = True
                    self._end(parts[3])
                return Canned(200, self._view(parts[3]))
        return super().on_post(path, payload)

    def on_get(self, path: str) -> Canned:
        route, _, query = path.partition("?")
        parts = route.strip("/").split("/")
        if route == "/v1/messages/batches":
            params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            limit = int(params.get("limit", "20"))
            with self._lock:
                newest = list(reversed(self.batches))
                if "after_id" in params:
                    newest = newest[newest.index(params["after_id"]) + 1 :]
                page = [self._view(b) for b in newest[:limit]]
                return Canned(200, {
                    "data": page, "has_more": len(newest) > limit,
                    "first_id": page[0]["id"] if page else None,
                    "last_id": page[-1]["id"] if page else None,
                })  # fmt: skip
        if len(parts) == 4 and parts[3] in self.batches:
            with self._lock:
                self.retrieved_at.append(time.monotonic())
                if self.retrieve_script:
                    return self.retrieve_script.popleft()
                batch = self.batches[parts[3]]
                batch["polls"] += 1
                if batch["results"] is None and batch["polls"] > self.polls_in_progress:
                    self._end(parts[3])
                return Canned(200, self._view(parts[3]))
        if len(parts) == 5 and parts[4] == "results" and parts[3] in self.batches:
            with self._lock:
                lines = self.batches[parts[3]]["results"]
            if lines is None:
                return error(404, "not_found_error", "results are not ready")
            return Canned(200, {"jsonl": "".join(json.dumps(x) + "\n" for x in lines)})
        return super().on_get(path)


@contextmanager
def serving(monkeypatch: Any, server: FakeMessages) -> Iterator[FakeMessages]:
    """`server` running, the Anthropic SDK pointed at it with the test key, Message Batches
    chunks of 2 rows polled 10 ms apart: what every test of batch drafting starts from."""
    with server.running():
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("NOTIFIER_BATCH_CHUNK_ROWS", "2")
        monkeypatch.setenv("NOTIFIER_BATCH_POLL_S", "0.01")
        yield server
