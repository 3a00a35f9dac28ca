"""A webhook receiver on 127.0.0.1 whose every answer is scripted, byte for byte: for the
tests of what notifier takes an answer to prove (a status page that is no receipt, a
Retry-After it cannot read). Each POST and each GET takes the next answer of its script
(the last one repeats); it counts what arrived."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b"{}"
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)


@dataclass
class Script:
    posts: Sequence[Reply]
    gets: Sequence[Reply] = (Reply(404, b'{"error": "no such key"}'),)
    posted: int = 0
    got: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, method: str) -> Reply:
        with self.lock:
            if method == "POST":
                self.posted += 1
                return self.posts[min(self.posted, len(self.posts)) - 1]
            self.got += 1
            return self.gets[min(self.got, len(self.gets)) - 1]


@contextmanager
def scripted(script: Script) -> Iterator[int]:
    """`script` served on a free port of 127.0.0.1 for as long as the block runs: the port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(script.next("POST"))

        def do_GET(self) -> None:
            self._reply(script.next("GET"))

        def _reply(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for name, value in reply.headers:
                self.send_header(name, value)  # latin-1, as http.server writes headers
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def hooks_config(port: int, *, status: bool, idempotent: bool = False) -> str:
    """notifier.toml text for a `hooks` webhook to `port`: no query window to wait out, and
    quick retries."""
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "http://127.0.0.1:{port}/notifications"',
        f"idempotent = {'true' if idempotent else 'false'}",
        "timeout = 2",
        "query_delay = 0",
    ]
    if status:
        lines.append(f'status_url = "http://127.0.0.1:{port}/notifications/{{key}}"')
    retry = "[retry]\nmax_attempts = 3\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
    return "\n".join(lines) + "\n" + retry
