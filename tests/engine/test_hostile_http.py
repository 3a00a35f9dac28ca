"""A webhook receiver that trickles, streams forever or stalls cannot hold a run: each
attempt (connect, headers, body) is bounded as a whole by the channel's `timeout`, a body is
read up to a cap, and the other items keep going."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ..conftest import Workspace, make_rows

STOP = threading.Event()


class Hostile(BaseHTTPRequestHandler):
    """u1: the status line trickles a byte at a time, forever; u2: 200 with a body that never
    ends; u3: never answers; everyone else: 201 with a receipt."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        document = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        item = document["item_id"]
        self.server.arrivals.append(item)  # type: ignore[attr-defined]
        if item == "u1":
            for byte in b"HTTP/1.1 200 OK\r\n" * 10_000:
                if STOP.wait(0.2):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        elif item == "u2":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 65536
            while not STOP.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        elif item == "u3":
            STOP.wait(120)
        else:
            reply = json.dumps({"id": f"r-{item}"}).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)


@pytest.fixture
def hostile(ws: Workspace) -> Iterator[ThreadingHTTPServer]:
    STOP.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    server.arrivals = []  # type: ignore[attr-defined]
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    port = server.server_address[1]
    (ws.path / "notifier.toml").write_text(
        f'[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:{port}/n"\ntimeout = 1\n'
    )
    yield server
    STOP.set()
    server.shutdown()
    server.server_close()


def test_trickling_endless_and_stalled_answers_cannot_hang_the_run(
    ws: Workspace, hostile: ThreadingHTTPServer
) -> None:
    """With timeout = 1, `send` ends in seconds: the trickled and the stalled items are
    uncertain (unknown on a channel that cannot dedupe), the endless 200 counts as accepted
    with its body cut at the cap, and every other item is sent."""
    ws.write_csv("batch.csv", make_rows(6))
    started = time.monotonic()
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    elapsed = time.monotonic() - started
    assert result.exit_code == 3, result.output
    assert elapsed < 30, f"the run took {elapsed:.1f}s"
    states = ws.ledger.states()
    assert states == {
        "u1": "unknown",
        "u2": "sent",
        "u3": "unknown",
        "u4": "sent",
        "u5": "sent",
        "u6": "sent",
    }
    assert sorted(hostile.arrivals) == ["u1", "u2", "u3", "u4", "u5", "u6"]  # type: ignore[attr-defined]
