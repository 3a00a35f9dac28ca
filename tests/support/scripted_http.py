"""A webhook receiver on 127.0.0.1 whose every answer is scripted, byte for byte: for the
tests of what notifier takes an answer to prove (a status page that is no receipt, a
Retry-After it cannot read). Each POST and each GET takes the next answer of its script
(the last one repeats) for ITS key: a POST's Idempotency-Key (none: one script for all), a
GET's last path segment. So at --concurrency 8 every item meets the same script, whatever
order the senders' requests interleave in. It counts what arrived, in all and per key."""

from __future__ import annotations

import threading
from collections import Counter
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
    posted_by: Counter[str] = field(default_factory=Counter)  # key -> POSTs with it
    got_by: Counter[str] = field(default_factory=Counter)  # key -> GETs of it
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def posted(self) -> int:
        return self.posted_by.total()

    @property
    def got(self) -> int:
        return self.got_by.total()

    def next(self, method: str, key: str) -> Reply:
        """The answer to the next request of `method` for `key` (the server's threads at
        once: under the lock)."""
        with self.lock:
            counts, replies = (
                (self.posted_by, self.posts) if method == "POST" else (self.got_by, self.gets)
            )
            counts[key] += 1
            return replies[min(counts[key], len(replies)) - 1]


@contextmanager
def scripted(script: Script) -> Iterator[int]:
    """`script` served on a free port of 127.0.0.1 for as long as the block runs: the port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(script.next("POST", self.headers.get("Idempotency-Key", "")))

        def do_GET(self) -> None:
            self._reply(script.next("GET", self.path.rsplit("/", 1)[-1]))

        def _reply(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for name, value in reply.headers:
                self.send_header(name, value)  # latin-1, as http.server writes headers
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # Every sender of a run at --concurrency 8 (and more) may connect at once: a
        # connection beyond the listen backlog (socketserver's 5) would wait for its SYN to
        # be sent again, a second, and could time out as a request that may have arrived.
        request_queue_size = 64
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
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
