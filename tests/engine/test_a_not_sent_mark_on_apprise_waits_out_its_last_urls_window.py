"""A `not-sent` mark proves nothing while the receiver may still commit the request
(docs/guarantees.md, "A `not-sent` mark waits out the receiver's window"). An Apprise channel
with several URLs notifies them one after the other, each request bounded by the channel's
`timeout`: the last URL's request leaves only once the ones before it ended. A service that
lost that request's connection at once may still commit it until `timeout` after it left,
well after `timeout` from the moment the notification started: a not-sent mark taken then
sends the notification to it a second time."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ..conftest import Workspace, free_port, make_rows

pytestmark = pytest.mark.timeout(90)

TIMEOUT_S = 1.0


class Service:
    """A plain HTTP server: `/slow` answers only after the channel's timeout (so its URL
    fails), `/cut` reads the request, closes the connection without an answer and commits
    the notification a moment later (when released, or at the latest 0.9 timeout after it
    arrived). Once `normal` is set, both answer 200 at once and commit."""

    def __init__(self) -> None:
        self.port = free_port()
        self.commits: dict[str, int] = {}
        self.release = threading.Event()
        self.normal = False
        self.cut_at: float | None = None
        self.committed_at: float | None = None
        self._sock = socket.create_server(("127.0.0.1", self.port))
        self._done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._done.set()
        self._sock.close()

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            while len(body) < length:
                body += conn.recv(65536)
            path = head.split(b" ")[1].decode()
            if self.normal:
                self._commit(path)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif path == "/slow":
                self._done.wait(3 * TIMEOUT_S)  # past the channel's read timeout
            else:
                self.cut_at = time.monotonic()
                conn.shutdown(socket.SHUT_RDWR)  # lost before any answer ...
                self.release.wait(0.9 * TIMEOUT_S)
                self.committed_at = time.monotonic()
                self._commit(path)  # ... and committed all the same

    def _commit(self, path: str) -> None:
        self.commits[path] = self.commits.get(path, 0) + 1


def test_a_not_sent_mark_on_apprise_is_refused_until_timeout_after_its_last_url_was_asked(
    ws: Workspace,
) -> None:
    service = Service()
    try:
        (ws.path / "notifier.toml").write_text(
            "[channels.alerts]\n"
            'type = "apprise"\n'
            f"timeout = {TIMEOUT_S}\n"
            f'urls = ["json://127.0.0.1:{service.port}/slow", '
            f'"json://127.0.0.1:{service.port}/cut"]\n'
        )
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "alerts", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u1").state == "unknown"
        marked = ws.invoke("reconcile", "--manual", "r1", "--item", "u1", "--mark", "not-sent",
                           "--evidence", "not there")  # fmt: skip
        marked_at = time.monotonic()
        service.release.set()
        deadline = time.monotonic() + 30
        while service.committed_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.cut_at is not None and service.committed_at is not None
        # The mark came while `/cut` could still commit: inside `timeout` after its request.
        assert marked_at < service.cut_at + TIMEOUT_S, "the test was too slow to show it"
        service.normal = True
        if marked.exit_code != 4:
            ws.invoke("resume", "r1")  # what the accepted mark promises: sent once more
        assert marked.exit_code == 4, (marked.output, service.commits)
        assert "may still commit" in marked.output
        assert service.commits.get("/cut") == 1, service.commits
    finally:
        service.close()
