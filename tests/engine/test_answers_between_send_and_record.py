"""What the runner does with an answer between the send and
the record — a throttled answer always gates its channel, waits run on the monotonic clock,
and no answer (unreadable, absurd) can throw away the window's other outcomes.

A receiver of the test's own on 127.0.0.1, scripted per item, logs when each request arrives."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any

import pytest

from notifier.domain import clock, waits
from notifier.engine import judging, sending

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke
from ..support.waits import scale_waits

# A body that claims to be gzip but is not: reading it raises httpx2.DecodingError.
BROKEN_GZIP = (("Content-Encoding", "gzip"),), b"this is not gzip at all"


@dataclass
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


def created(item_id: str) -> Reply:
    return Reply(201, (("Content-Type", "application/json"),), json.dumps({"id": item_id}).encode())


@dataclass
class Receiver:
    """Per item id, the answers to its POSTs in turn (then 201); GET /status/KEY answers
    `status_reply` (default 404). Every request is logged with its monotonic arrival time."""

    posts: dict[str, list[Reply]] = field(default_factory=dict)
    status_reply: Reply | None = None
    log: list[tuple[float, str, str]] = field(default_factory=list)  # (monotonic, method, id)
    on_answer: Any = None  # called with (item_id, reply) right before a POST is answered
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, item_id: str) -> Reply:
        with self.lock:
            self.log.append((time.monotonic(), "POST", item_id))
            queue = self.posts.get(item_id)
            return queue.pop(0) if queue else created(item_id)

    def status(self, key: str) -> Reply:
        with self.lock:
            self.log.append((time.monotonic(), "GET", key))
        return self.status_reply or Reply(404)

    def arrivals(self, item_id: str) -> list[float]:
        with self.lock:
            return [t for t, method, who in self.log if method == "POST" and who == item_id]


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep the test output clean

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            item_id = str(json.loads(raw).get("item_id"))
            reply = state.post(item_id)
            if state.on_answer is not None:
                state.on_answer(item_id, reply)
            self._answer(reply)

        def do_GET(self) -> None:
            self._answer(state.status(self.path.rsplit("/", 1)[-1]))

        def _answer(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for name, value in reply.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def configure(
    ws: Workspace,
    url: str,
    *,
    idempotent: bool,
    status: bool,
    max_attempts: int,
    deadline: float | None = None,
) -> None:
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "{url}/notifications"',
        f"idempotent = {'true' if idempotent else 'false'}",
        "timeout = 5",
    ]
    if status:
        lines.append(f'status_url = "{url}/status/{{key}}"')
    lines += [
        "[retry]",
        f"max_attempts = {max_attempts}",
        "backoff_base = 0.01",
        "backoff_max = 0.05",
    ]
    if deadline is not None:
        lines.append(f"deadline = {deadline}")
    (ws.path / "notifier.toml").write_text("\n".join(lines) + "\n")


def send(ws: Workspace, n: int, *args: str) -> Any:
    ws.write_csv("batch.csv", make_rows(n))
    return ws.invoke("send", "batch.csv", "--channel", "hooks", *args)


def run_id(ws: Workspace) -> str:
    return ws.ledger.run().run_id


def states(ws: Workspace) -> dict[str, str]:
    return ws.ledger.states()


def throttled(seconds: str) -> Reply:
    return Reply(429, (("Retry-After", seconds),), b"slow down")


# ---------------------------------------------------------------------------- point 6


def test_throttled_answer_gates_channel_even_when_it_ends_its_item(
    ws: Workspace, receiver: tuple[Receiver, str], fast_waits: float
) -> None:
    """A 429 with Retry-After 2 that ends its item (a throttle spends no attempt, so only
    the item's deadline ends it: 0 here, passed at once) still closes the channel: the next
    request on it arrives no sooner than that wait (scaled by the test switch)."""
    state, url = receiver
    state.posts["u1"] = [throttled("2")]
    configure(ws, url, idempotent=True, status=False, max_attempts=5, deadline=0)
    result = send(ws, 2)
    assert result.exit_code == 3, result.output  # u1 failed: completed with failures
    assert states(ws) == {"u1": "failed", "u2": "sent"}
    assert "deadline passed while the channel kept throttling" in result.output
    (first,) = state.arrivals("u1")
    (second,) = state.arrivals("u2")
    assert second - first >= 0.95 * waits.scaled(2)


def test_throttled_gate_survives_a_crash(
    ws: Workspace, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed right after recording a 429 (Retry-After 3): `resume` in a new
    process still keeps the channel closed, for every item, until 3 s (scaled by the test
    switch) after that answer."""
    # Half, not less: the resume must start well inside the gate for the gate to be what
    # holds it back (checked below), however slowly the crashed process dies.
    scale_waits(monkeypatch, 0.5)
    state, url = receiver
    state.posts["u1"] = [throttled("3")]
    configure(ws, url, idempotent=True, status=False, max_attempts=5)
    ws.write_csv("batch.csv", make_rows(2))
    crash_invoke(ws, "after-receipt:1", "send", "batch.csv", "--channel", "hooks")
    assert states(ws) == {"u1": "pending", "u2": "pending"}
    resumed_at = time.monotonic()
    result = ws.invoke("resume", run_id(ws))
    assert result.exit_code == 0, result.output
    (first, _) = state.arrivals("u1")
    (second,) = state.arrivals("u2")
    gate = waits.scaled(3)
    # Without the restored gate, u2 would have gone as soon as the resume began.
    assert resumed_at - first < 0.8 * gate, "the resume began too late to test the gate"
    assert second - first >= 0.95 * gate


# ---------------------------------------------------------------------------- point 7


def test_wall_clock_jump_does_not_cut_a_retry_after_short(
    ws: Workspace, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock jumping an hour forward right after a 429 with Retry-After 2 does not
    end the wait: the retry still arrives no sooner than that wait (scaled) after the 429."""
    # Half, not less: the jump, 0.3 s after the 429, must land well inside the wait.
    scale_waits(monkeypatch, 0.5)
    state, url = receiver
    state.posts["u1"] = [throttled("2")]
    throttled_at: list[float] = []

    def note(item_id: str, reply: Reply) -> None:
        if reply.status == 429:
            throttled_at.append(time.monotonic())

    state.on_answer = note
    real_now = clock.now

    def jumping_now() -> datetime:
        # An hour ahead from 0.3 s after the 429 was answered (after the runner noted when
        # the answer arrived, before the wait could end).
        if throttled_at and time.monotonic() > throttled_at[0] + 0.3:
            return real_now() + timedelta(hours=1)
        return real_now()

    monkeypatch.setattr(clock, "now", jumping_now)
    configure(ws, url, idempotent=True, status=False, max_attempts=3)
    result = send(ws, 1)
    assert result.exit_code == 0, result.output
    first, second = state.arrivals("u1")
    assert second - first >= 0.95 * waits.scaled(2)


def test_wall_clock_jump_does_not_cut_an_item_backoff_short(
    ws: Workspace, receiver: tuple[Receiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item's own wait (a 409 with Retry-After 2, which does not close the channel) is
    timed on the monotonic clock too: a wall-clock jump of an hour does not end it early."""
    scale_waits(monkeypatch, 0.5)  # the jump, 0.3 s in, lands inside both waits (1 s, 0.5 s)
    state, url = receiver
    state.posts["u1"] = [Reply(409, (("Retry-After", "2"),), b"in progress")]
    # u2's shorter wait wakes the runner after the jump, when u1 looks due by the wall clock.
    state.posts["u2"] = [Reply(409, (("Retry-After", "1"),), b"in progress")]
    answered: list[float] = []
    state.on_answer = lambda item_id, reply: answered.append(time.monotonic())
    real_now = clock.now

    def jumping_now() -> datetime:
        if answered and time.monotonic() > answered[0] + 0.3:
            return real_now() + timedelta(hours=1)
        return real_now()

    monkeypatch.setattr(clock, "now", jumping_now)
    configure(ws, url, idempotent=True, status=False, max_attempts=3)
    result = send(ws, 2)
    assert result.exit_code == 0, result.output
    first, second = state.arrivals("u1")
    assert second - first >= 0.95 * waits.scaled(2)


# ---------------------------------------------------------------------------- point 10


@pytest.mark.parametrize(
    ("module", "name"), [(sending, "ask"), (judging, "decide")], ids=["query", "decision"]
)
def test_an_exception_while_judging_keeps_the_window(
    ws: Workspace,
    receiver: tuple[Receiver, str],
    monkeypatch: pytest.MonkeyPatch,
    module: ModuleType,
    name: str,
) -> None:
    """An unexpected exception while judging one item's answer (the status query its
    sender asks breaks, or the committer's decision itself) makes that item unknown and
    keeps the window's 201s as sent."""
    state, url = receiver
    state.posts["u1"] = [Reply(500, (), b"boom")]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("machinery broke")

    # The wire does not matter here: what is pinned is the runner's handling of a bug.
    monkeypatch.setattr(module, name, broken)
    configure(ws, url, idempotent=False, status=True, max_attempts=3)
    result = send(ws, 4, "--concurrency", "4")
    assert result.exit_code == 3, result.output
    assert states(ws) == {"u1": "unknown", "u2": "sent", "u3": "sent", "u4": "sent"}
    assert len(state.arrivals("u1")) == 1


def test_undecodable_answers_in_a_window_keep_the_201s(
    ws: Workspace, receiver: tuple[Receiver, str]
) -> None:
    """In a window of 4, an item whose POST answer and status answer cannot be decoded
    becomes unknown, while the items that got 201 are recorded as sent; neither the send
    nor a later resume exits 1."""
    state, url = receiver
    state.posts["u1"] = [Reply(500, (), b"boom")]  # uncertain: the runner asks the status URL
    state.posts["u2"] = [Reply(201, *BROKEN_GZIP)]  # a 201 nobody can read: uncertain
    state.status_reply = Reply(200, *BROKEN_GZIP)
    configure(ws, url, idempotent=False, status=True, max_attempts=3)
    result = send(ws, 4, "--concurrency", "4")
    assert result.exit_code == 3, result.output
    assert states(ws) == {"u1": "unknown", "u2": "unknown", "u3": "sent", "u4": "sent"}
    assert ws.ledger.receipt_count() == 2
    again = ws.invoke("resume", run_id(ws))
    assert again.exit_code == 3, again.output
    assert states(ws)["u3"] == "sent"
    assert len(state.arrivals("u1")) == 1  # never re-sent blindly


def test_absurd_retry_after_pauses_the_run(ws: Workspace, receiver: tuple[Receiver, str]) -> None:
    """`Retry-After: 999999999999` is clamped, not an overflow: the run pauses with exit 3
    and `status` still works."""
    state, url = receiver
    state.posts["u1"] = [throttled("999999999999")]
    configure(ws, url, idempotent=True, status=False, max_attempts=3)
    result = send(ws, 2)
    assert result.exit_code == 3, result.output
    assert "paused" in result.output
    report = ws.status()
    assert report["state"] == "paused"
    # The 429 closed the whole channel, so u2 waits too.
    assert states(ws) == {"u1": "pending", "u2": "pending"}


def test_status_endpoint_with_broken_encoding_leaves_item_unknown(
    ws: Workspace, receiver: tuple[Receiver, str]
) -> None:
    """A status endpoint whose answer cannot be decoded proves nothing: the uncertain item
    stays unknown (exit 3) on send and on `reconcile`, and is never sent again."""
    state, url = receiver
    state.posts["u1"] = [Reply(504, (), b"gateway timeout")]
    state.status_reply = Reply(200, *BROKEN_GZIP)
    configure(ws, url, idempotent=False, status=True, max_attempts=3)
    result = send(ws, 1)
    assert result.exit_code == 3, result.output
    assert states(ws) == {"u1": "unknown"}
    again = ws.invoke("reconcile", run_id(ws))
    assert again.exit_code == 3, again.output
    assert states(ws) == {"u1": "unknown"}
    assert len(state.arrivals("u1")) == 1


@pytest.mark.both_stores
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("answer", ["replay", "another-digest"])
def test_an_exception_while_judging_a_receipt_that_proves_nothing_never_records_it_sent(
    ws: Workspace,
    receiver: tuple[Receiver, str],
    monkeypatch: pytest.MonkeyPatch,
    n: int,
    answer: str,
) -> None:
    """The committer's decision breaks (a bug) on every answer. A 2xx is still a delivery
    (the downstream said it holds it), but not a replay no attempt of ours explains, nor a
    receipt naming another intent's digest: neither proves our notification delivered, so
    u1 is never recorded sent (a sent row is never sent again, nor reported undelivered);
    the run halts as the sender read the answer (exit 4)."""
    state, url = receiver
    json_type = ("Content-Type", "application/json")
    if answer == "replay":
        replayed = (json_type, ("Idempotent-Replayed", "true"))
        state.posts["u1"] = [Reply(200, replayed, b'{"id": "r1"}')]
    else:
        other = json.dumps({"id": "r1", "intent_digest": "sha256:" + "0" * 64}).encode()
        state.posts["u1"] = [Reply(200, (json_type,), other)]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("machinery broke")

    monkeypatch.setattr(judging, "decide", broken)
    configure(ws, url, idempotent=True, status=False, max_attempts=3)
    result = send(ws, 3 * n + 1, "--concurrency", str(n))  # at N = 8, items claimed ahead
    assert result.exit_code == 4, result.output
    assert states(ws)["u1"] == "unknown", result.output
    assert ws.ledger.item("u1").receipt_id is None
