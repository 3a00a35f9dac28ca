"""A scripted webhook receiver on 127.0.0.1 for the tests of every concurrency: it answers
each POST as the test says (a status per item, a hold until released, a commit some time
after the request arrived, an early 504 or reset while the request is committed later) and
notes when each request arrived and what it committed."""

from __future__ import annotations

import io
import json
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WAIT_S = 30.0  # no hold or wait in these tests lasts longer than this


@dataclass
class Arrival:
    item_id: str
    key: str
    wall: float  # time.time() when the request arrived


class HoldAfter(threading.Event):
    """A receiver's hold that lets the first `free` answers through at once and holds every
    later one until set: a run mid-way with some items sent and the rest held."""

    def __init__(self, free: int) -> None:
        super().__init__()
        self.free = free
        self._count = threading.Lock()

    def wait(self, timeout: float | None = None) -> bool:
        with self._count:
            self.free -= 1
            if self.free >= 0:
                return True
        return super().wait(timeout)


@dataclass
class Receiver:
    """What to answer (`answer(item_id, nth POST of that item)`: a status, or None for 200
    with a receipt) and what happened."""

    answer: Callable[[str, int], int | None] = lambda item_id, n: None
    retry_after: str | None = None
    commit_delay_s: float = 0.0  # the request is committed (and answered) this long after
    hold: threading.Event | None = None  # every 2xx answer waits for this, when set
    # Every 2xx answer waits for this after its request was committed, when set: a request
    # delivered whose answer has not come back yet.
    answer_hold: threading.Event | None = None
    # A scripted status is answered after the request was committed (a proxy's 5xx for a
    # request the receiver did take): the delivery happened, its answer is lost.
    commit_first: bool = False
    # Every status query waits for this before it answers, when set (the query has arrived:
    # it is in `queries`).
    query_hold: threading.Event | None = None
    # With `query_hold`: only the queries of these keys wait for it, when set.
    query_hold_keys: set[str] | None = None
    # The status query's answer: None for the truth (200 or 404), else this status; it is
    # given `query_delay_s` after the query arrived.
    query_status: int | None = None
    query_delay_s: float = 0.0
    # A gateway in front of the receiver that answers every POST at once, "504" (a gateway
    # timeout) or "reset" (the connection reset), while the request it passed on is
    # committed `commit_after_s` after it arrived: visible to the status query from then
    # on, and counted in `commits`.
    early: str | None = None
    commit_after_s: float = 0.0
    # With `early`: the late commit waits for this instead of `commit_after_s`, when set (a
    # test that must see the request uncommitted first releases it on a condition).
    commit_hold: threading.Event | None = None
    queries: list[float] = field(default_factory=list)  # time.time() of each status query
    queried: list[str] = field(default_factory=list)  # the key of each, looked up on arrival
    arrivals: list[Arrival] = field(default_factory=list)
    commits: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float = WAIT_S) -> None:
        """Block until `predicate(self)` holds (checked on every arrival and commit)."""
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self), timeout), "receiver: timed out"

    def posts(self, item_id: str) -> int:
        return sum(1 for a in self.arrivals if a.item_id == item_id)

    def commit(self, key: str, digest: str) -> None:
        """The request under `key` is committed: the status query finds it from now on."""
        with self.changed:
            self.commits[key] = self.commits.get(key, 0) + 1
            self.digests[key] = digest
            self.changed.notify_all()

    def deliveries(self) -> dict[str, int]:
        """How many times each item was committed, under whatever key (a row sent again in
        a new run has a new key: it is still a second copy for its recipient)."""
        with self.lock:
            item_of = {a.key: a.item_id for a in self.arrivals}
            counted: dict[str, int] = {}
            for key, n in self.commits.items():
                counted[item_of[key]] = counted.get(item_of[key], 0) + n
            return counted


class _Handler(BaseHTTPRequestHandler):
    receiver: Receiver
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        r = self.receiver
        document = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        item_id, key = document["item_id"], self.headers["Idempotency-Key"]
        with r.changed:
            r.arrivals.append(Arrival(item_id, key, time.time()))
            n = r.posts(item_id)
            r.changed.notify_all()
        if r.early is not None:
            digest = self.headers["Notifier-Intent-Digest"]
            hold = r.commit_hold

            def commit_when_released() -> None:
                assert hold is not None
                if hold.wait(WAIT_S):
                    r.commit(key, digest)

            later = (
                threading.Timer(r.commit_after_s, r.commit, (key, digest))
                if hold is None
                else threading.Thread(target=commit_when_released)
            )
            later.daemon = True
            later.start()
            if r.early == "reset":
                self._reset()
            else:
                self._reply(504, {"error": "gateway timeout"})
            return
        status = r.answer(item_id, n)
        if status is not None and r.commit_first:
            self._commit(key)
        if status is not None:
            headers = {"Retry-After": r.retry_after} if r.retry_after and status == 429 else {}
            self._reply(status, {"error": f"scripted {status}"}, headers)
            return
        if r.commit_delay_s:
            time.sleep(r.commit_delay_s)  # the receiver's own slowness, not a test's wait
        if r.hold is not None:
            r.hold.wait(WAIT_S)
        self._commit(key)
        if r.answer_hold is not None:
            r.answer_hold.wait(WAIT_S)
        self._reply(200, {"id": "r-" + key, "intent_digest": r.digests[key]})

    def _commit(self, key: str) -> None:
        self.receiver.commit(key, self.headers["Notifier-Intent-Digest"])

    def _reset(self) -> None:
        """Reset the connection (RST, no answer): linger 0, then close the socket itself,
        not only this handler's files on it (a plain close after them would send a FIN)."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.wfile.close()
        self.connection.close()
        # What the handler still flushes and closes after this: nothing, into nothing.
        self.rfile, self.wfile = io.BytesIO(), io.BytesIO()

    def do_GET(self) -> None:
        r = self.receiver
        key = self.path.rsplit("/", 1)[-1]
        with r.changed:
            r.queries.append(time.time())
            r.queried.append(key)
            digest = r.digests.get(key)
            r.changed.notify_all()
        if r.query_hold is not None and (r.query_hold_keys is None or key in r.query_hold_keys):
            r.query_hold.wait(WAIT_S)
        if r.query_delay_s:
            time.sleep(r.query_delay_s)  # the receiver's own slowness, not a test's wait
        if r.query_status is not None:
            self._reply(r.query_status, {"error": f"scripted {r.query_status}"})
        elif digest is None:
            self._reply(404, {"error": "no such key"})
        else:
            self._reply(200, {"id": "r-" + key, "intent_digest": digest})

    def _reply(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(document).encode()
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client is gone (killed): what was committed stays committed

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    # A listen backlog for every sender connecting at once (the default, 5, drops the
    # SYNs past it: those requests then leave a second later, the kernel's retry).
    request_queue_size = 128


@contextmanager
def receiving(receiver: Receiver, port: int = 0) -> Iterator[Receiver]:
    """`receiver` serving on `port` (default: a free one) of 127.0.0.1 until the block ends."""
    handler = type("Handler", (_Handler,), {"receiver": receiver})
    server = _Server(("127.0.0.1", port), handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield receiver
    finally:
        if receiver.hold is not None:
            receiver.hold.set()
        if receiver.query_hold is not None:
            receiver.query_hold.set()
        if receiver.answer_hold is not None:
            receiver.answer_hold.set()
        server.shutdown()
        server.server_close()
        thread.join()


def webhook_config(
    receiver: Receiver,
    *,
    idempotent: bool,
    status: bool,
    timeout: float = 5,
    query_delay: float = 0,
    extra: str = "",
    retry: str = "[retry]\nmax_attempts = 3\nbackoff_base = 0.02\nbackoff_max = 0.1\n",
) -> str:
    """notifier.toml text for a `hooks` webhook channel sending to `receiver`."""
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "{receiver.url}/notifications"',
        f"idempotent = {'true' if idempotent else 'false'}",
        f"timeout = {timeout}",
        f"query_delay = {query_delay}",
    ]
    if status:
        lines.append(f'status_url = "{receiver.url}/notifications/{{key}}"')
    return "\n".join(lines) + "\n" + extra + retry


@contextmanager
def released(processes: list[subprocess.Popen[str]], *holds: threading.Event) -> Iterator[None]:
    """However the block ends: every hold set (nothing waits on the receiver any more), and
    each process still running killed and reaped."""
    try:
        yield
    finally:
        for hold in holds:
            hold.set()
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
