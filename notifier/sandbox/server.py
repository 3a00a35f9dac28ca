"""A local HTTP notification provider with seeded fault injection (docs/design.md section 6).

`notifier sandbox` runs it from the command line; tests, demos and benchmarks start it
in-process as the stand-in downstream. It behaves like a careful real provider, following
the IETF Idempotency-Key draft:

- `POST /notifications` with a JSON object and an `Idempotency-Key` header commits one
  delivery (201). The same key with the same payload replays the first answer
  (`Idempotent-Replayed: true`); the same key with another payload is refused (422) and
  never overwrites; the same key while the first request is still being processed is
  refused (409).
- `GET /notifications/{key}` answers 200 with the stored delivery, 409 while the key is
  being processed, 404 for an unknown key.
- `GET /stats` and `GET /deliveries` let tests check what was committed, exactly once.
- `POST /v1/messages` (and `GET /v1/models/{id}`) stand in for Claude's Messages API, so
  `send --compose` can be rehearsed offline: every row gets a deterministic draft that quotes
  its columns, free and with no network (sandbox_state.draft_reply).

Faults (latency, 429 with Retry-After, 503, 500, "commit then drop the connection", and
forced answers per item) are drawn from one seeded random generator, so a seed always gives
the same sequence of answers for the same sequence of requests.

The fault model and the state behind the answers are in faults.py; this module is
the HTTP server around them. Standard library only. The handler speaks HTTP/1.1 with
keep-alive and disables Nagle's algorithm: without it, every small response waits ~40 ms
for the client's delayed ACK.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import unquote

# Faults and payload_identity are part of this module's interface (tests and demos import
# them from here); NO_KEY names the stats key of deliveries without an Idempotency-Key.
from notifier.sandbox.faults import (
    MESSAGES_PATH,
    MODELS_PREFIX,
    NO_KEY,
    Fault,
    Faults,
    Reply,
    State,
    draft_reply,
    error_reply,
    json_reply,
    model_reply,
    payload_identity,
)

__all__ = [
    "MAX_BODY_BYTES",
    "NOTIFICATIONS_PATH",
    "NO_KEY",
    "Faults",
    "Sandbox",
    "payload_identity",
    "run_sandbox",
]

NOTIFICATIONS_PATH: Final = "/notifications"
_KEY_PREFIX: Final = NOTIFICATIONS_PATH + "/"
# Larger bodies are refused (413) rather than read into memory.
MAX_BODY_BYTES: Final = 10 * 1024 * 1024
# How often the serving loop checks for stop(); a real Ctrl-C interrupts it at once.
_POLL_INTERVAL: Final = 0.05
# Statuses whose responses never carry a body (RFC 9110 §6.4.1).
_NO_BODY_STATUSES: Final = frozenset({204, 304})
_NOT_JSON: Final = error_reply(400, "the body must be a JSON object (UTF-8)")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The default backlog of 5 drops SYNs (a one-second stall) when many clients connect.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: State) -> None:
        self.state = state
        self._connections: set[socket.socket] = set()
        self._closing = False
        self._all_closed = threading.Condition(state.lock)  # notified as each one closes
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a reverse DNS lookup that can
        # stall or leave the machine); the sandbox never needs it.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        # Tracked here, in the serving thread, the moment it is accepted (not once its
        # handler thread gets to run): `Sandbox.quiesce` must see every accepted connection.
        self.track(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        try:
            super().shutdown_request(request)
        finally:
            self.untrack(request)

    def wait_all_closed(self, timeout: float) -> bool:
        """Wait until no accepted connection is open; whether that happened in time."""
        with self._all_closed:
            return self._all_closed.wait_for(lambda: not self._connections, timeout)

    def track(self, connection: socket.socket) -> None:
        with self.state.lock:
            self.state.connections += 1
            if not self._closing:
                self._connections.add(connection)
                return
        _shutdown_quietly(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self.state.lock:
            self._connections.discard(connection)
            self._all_closed.notify_all()

    def close_connections(self) -> None:
        """Shut down every open keep-alive connection, so no handler thread lingers waiting
        for a next request that will never come."""
        with self.state.lock:
            self._closing = True
            connections = list(self._connections)
        for connection in connections:
            _shutdown_quietly(connection)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (or a connection stop() shut down) is not an error.
        if isinstance(sys.exception(), OSError):
            return
        super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _shutdown_quietly(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the peer
        connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "notifier-sandbox/1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default one-line-per-request log on stderr."""

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:
            # The client went away mid-request, or stop() shut the connection down:
            # there is nobody left to answer.
            self.close_connection = True

    # --- routing -------------------------------------------------------------------------

    def do_POST(self) -> None:
        raw = self._read_body()
        if raw is None:
            return
        if self._path() == MESSAGES_PATH:
            request = _parse_object(raw)
            self._send(draft_reply(request) if request is not None else _NOT_JSON)
            return
        if self._path() != NOTIFICATIONS_PATH:
            self._send(error_reply(404, "not found"))
            return
        reply, drop = self._post_notification(raw)
        if drop:
            self._drop()
        else:
            self._send(reply)

    def do_GET(self) -> None:
        if self._read_body() is None:
            return
        path = self._path()
        state = self.server.state
        if path == "/stats":
            self._send(json_reply(200, state.stats()))
        elif path == "/deliveries":
            self._send(json_reply(200, state.snapshot_deliveries()))
        elif path.startswith(_KEY_PREFIX) and len(path) > len(_KEY_PREFIX):
            self._send(state.lookup(unquote(path[len(_KEY_PREFIX) :])))
        elif path.startswith(MODELS_PREFIX) and len(path) > len(MODELS_PREFIX):
            self._send(model_reply(unquote(path[len(MODELS_PREFIX) :])))
        else:
            self._send(error_reply(404, "not found"))

    def do_HEAD(self) -> None:
        self.do_GET()

    def _not_found(self) -> None:
        if self._read_body() is not None:
            self._send(error_reply(404, "not found"))

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _not_found

    # --- POST /notifications -------------------------------------------------------------

    def _post_notification(self, raw: bytes) -> tuple[Reply, bool]:
        """The answer to one POST, and whether to drop the connection instead of sending it.
        Sleeps the configured latency before answering, never holding the lock."""
        state = self.server.state
        faults = state.faults
        with state.lock:
            state.requests += 1

        body = _parse_object(raw)
        if body is None:
            self._latency()
            return _NOT_JSON, False

        fault, faulted_reply = state.decide(body.get("item_id"))
        if faulted_reply is not None:
            self._latency()
            return faulted_reply, False
        drop = fault is Fault.DROP

        key = self.headers.get("Idempotency-Key") or None
        digest = self.headers.get("Notifier-Intent-Digest") or payload_identity(body)

        if faults.idempotent:
            if key is None:
                self._latency()
                return error_reply(400, "missing Idempotency-Key header"), drop
            answered = state.claim(key, digest)
            if answered is not None:
                self._latency()
                return answered, drop

        self._latency()  # in idempotent mode the key is marked "processing" meanwhile
        return state.commit(key, digest, body, raw, self._header_dict()), drop

    def _latency(self) -> None:
        if self.server.state.faults.latency_ms > 0:
            time.sleep(self.server.state.faults.latency_ms / 1000.0)

    def _header_dict(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            lowered = name.lower()
            headers[lowered] = f"{headers[lowered]}, {value}" if lowered in headers else value
        return headers

    # --- wire ----------------------------------------------------------------------------

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _read_body(self) -> bytes | None:
        """The request body, read by Content-Length; None (after answering and closing) when
        it cannot be read and the connection would be out of step."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._send(error_reply(411, "send the body with a Content-Length"))
            return None
        try:
            length = int(self.headers.get("Content-Length") or "0")
            if length < 0:
                raise ValueError(length)
        except ValueError:
            self.close_connection = True
            self._send(error_reply(400, "invalid Content-Length"))
            return None
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(error_reply(413, f"bodies are limited to {MAX_BODY_BYTES} bytes"))
            return None
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client went away mid-body
            self.close_connection = True
            return None
        return raw

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.status in _NO_BODY_STATUSES:
            self.end_headers()
            return
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _drop(self) -> None:
        """Close the connection without writing a single response byte."""
        self.close_connection = True
        _shutdown_quietly(self.connection)


def _parse_object(raw: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return document if isinstance(document, dict) else None


class Sandbox:
    """The sandbox provider. The socket is bound on construction (port 0 picks a free port;
    `url` reports the real one); `start()` serves in a daemon thread, `serve_forever()` in
    the calling thread. Use it as a context manager to start and stop it."""

    # Faults is a frozen dataclass (faults.py): one default shared by every call is safe.
    def __init__(self, host: str = "127.0.0.1", port: int = 0, faults: Faults = Faults()) -> None:  # noqa: B008
        self.faults = faults
        self._state = State(self.faults)
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), self._state)
        self._lifecycle = threading.Lock()
        self._thread: threading.Thread | None = None
        self._serving = False
        self._stopped = False
        self._released = False

    @property
    def url(self) -> str:
        """Base URL with the bound port, e.g. `http://127.0.0.1:54321`."""
        host = str(self._server.server_address[0])
        port = int(self._server.server_address[1])
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def notifications_url(self) -> str:
        return self.url + NOTIFICATIONS_PATH

    def start(self) -> Sandbox:
        """Serve in a daemon thread; returns self."""
        with self._lifecycle:
            self._check_startable()
            self._serving = True
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": _POLL_INTERVAL},
                name=f"notifier-sandbox-{self.url}",
                daemon=True,
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until `stop()` (from another thread) or Ctrl-C
        (KeyboardInterrupt, swallowed); the socket is closed when this returns."""
        with self._lifecycle:
            self._check_startable()
            self._serving = True
        try:
            self._server.serve_forever(poll_interval=_POLL_INTERVAL)
        except KeyboardInterrupt:
            pass
        finally:
            with self._lifecycle:
                self._serving = False
            self._release()

    def stop(self) -> None:
        """Stop serving, close open connections and the socket; wait for the serving
        thread. Idempotent. Must not be called from a request handler."""
        with self._lifecycle:
            if self._stopped:
                return
            self._stopped = True
            serving = self._serving
            thread = self._thread
        if serving:
            self._server.shutdown()  # returns once the serving loop has exited
        if thread is not None:
            thread.join()
        self._release()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def quiesce(self, timeout: float = 30.0) -> None:
        """Return once every request sent to the sandbox before this call has been handled,
        for when no client is running any more (one was just killed, say). A probe through
        the listener is accepted only after every connection queued before it; then every
        open connection is awaited until it closes: a dead client's kernel closed its end, so
        each handler reads what was sent, answers, sees the end and closes. TimeoutError if a
        connection stays open (a client still running)."""
        address = (str(self._server.server_address[0]), int(self._server.server_address[1]))
        with socket.create_connection(address, timeout=timeout) as probe:
            probe.sendall(b"GET /stats HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
            while probe.recv(65536):  # the answer, then the end: the probe was handled
                pass
        if not self._server.wait_all_closed(timeout):
            raise TimeoutError(f"{self.url}: connections still open after {timeout:g} s")

    def stats(self) -> dict[str, Any]:
        """The same document as `GET /stats`."""
        return self._state.stats()

    def deliveries(self) -> list[dict[str, Any]]:
        """The same document as `GET /deliveries`: every committed delivery, in order."""
        return self._state.snapshot_deliveries()

    def _check_startable(self) -> None:
        if self._stopped or self._released:
            raise RuntimeError("this sandbox has been stopped; create a new one")
        if self._serving:
            raise RuntimeError("this sandbox is already serving")

    def _release(self) -> None:
        with self._lifecycle:
            if self._released:
                return
            self._released = True
        self._server.close_connections()
        self._server.server_close()


def run_sandbox(host: str, port: int, faults: Faults, announce: Callable[[str], None]) -> None:
    """Blocking: bind, `announce("sandbox listening on <notifications_url>")` once bound,
    serve until Ctrl-C (KeyboardInterrupt), then close cleanly and return."""
    sandbox = Sandbox(host, port, faults)
    try:
        announce(f"sandbox listening on {sandbox.notifications_url}")
        sandbox.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sandbox.stop()
