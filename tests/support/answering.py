"""A receiver on 127.0.0.1 that answers every POST the same way, for the tests of what
notifier keeps and shows of an answer (a secret it quotes, a receipt id): its status, and
a body made from the request."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def answering(status: int, says: Callable[[BaseHTTPRequestHandler], str]) -> Iterator[int]:
    """Every POST answered `status` with `says(request)` as its body, for as long as the
    block runs. Its port."""

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = says(self).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
