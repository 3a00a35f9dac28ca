"""The continuous pipeline: N sends in flight at all times, crashes and drops at
N = 16 still deliver each key once, resume settles every in-flight item first, one slow
request does not stall the others, and --rate / `rate` pace each channel."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from notifier.api import Notifier
from notifier.channels.outbox import OutboxChannel
from notifier.engine.pipeline import claim_ahead
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke

FAST_RETRY = "[retry]\nmax_attempts = 12\nbackoff_base = 0.02\nbackoff_max = 0.2\n"


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    faults = getattr(request, "param", Faults(latency_ms=20))
    with Sandbox(faults=faults) as running:
        yield running


def configure(ws: Workspace, url: str, *, status_url: str | None = None, extra: str = "") -> None:
    lines = ["[channels.hooks]", 'type = "webhook"', f'url = "{url}"', "timeout = 5"]
    if status_url is not None:
        lines += ["idempotent = true", f'status_url = "{status_url}"']
    (ws.path / "notifier.toml").write_text("\n".join(lines) + "\n" + extra + "\n" + FAST_RETRY)


def configure_sandbox(ws: Workspace, sandbox: Sandbox, extra: str = "") -> None:
    status = f"{sandbox.url}/notifications/{{key}}"
    configure(ws, sandbox.notifications_url, status_url=status, extra=extra)


def commits(sandbox: Sandbox) -> dict[str, int]:
    return {k: v["commits"] for k, v in sandbox.stats()["keys"].items()}


def keys(ws: Workspace) -> list[str]:
    return ws.ledger.keys()


@pytest.mark.parametrize("sandbox", [Faults(seed=11, latency_ms=5, drop_rate=0.15)], indirect=True)
def test_random_drops_at_16_in_flight_commit_each_key_once(ws: Workspace, sandbox: Sandbox) -> None:
    """With 15% of requests committed then dropped unanswered, N = 16 still ends with each
    key committed exactly once (retried under the same key, deduplicated)."""
    configure_sandbox(ws, sandbox)
    ws.write_csv("batch.csv", make_rows(200))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", "16")
    assert result.exit_code == 0, result.output
    assert sandbox.stats()["keys"], "the sandbox saw nothing"
    assert commits(sandbox) == {key: 1 for key in keys(ws)}
    dropped = len([a for a in ws.ledger.attempts() if a.outcome == "uncertain"])
    assert dropped > 0, "the seed should drop some answers"


def test_resume_settles_all_16_in_flight_before_claiming_a_new_item(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """After a crash with N = 16 and a full pipeline in flight (16 handed to the senders and,
    the channel being queryable, 48 more claimed ahead), resume's first moves settle every
    one of them: every new claim in the database's event order comes after the last
    settlement."""
    configure_sandbox(ws, sandbox)
    # The crash comes right after the commit that claims item CRASH_AT: items are claimed in
    # order and one commit claims at most `capacity`, so none beyond CRASH_AT + capacity - 1
    # was ever claimed, however far the crashed process got; the rows after that are left
    # for resume to claim in every run. CRASH_AT > capacity: that commit is not the first,
    # so the senders had items (some answered, some not) when it came.
    capacity = 16 + claim_ahead(16, [OutboxChannel("hooks", ws.outbox)])
    crash_at = capacity + 36
    ws.write_csv("batch.csv", make_rows(crash_at + capacity + 16))
    send = ("send", "batch.csv", "--channel", "hooks", "--concurrency", "16")
    crash_invoke(ws, f"after-intent:{crash_at}", *send)
    in_flight = {i.seq for i in ws.ledger.items() if i.state == "in_flight"}
    assert len(in_flight) == capacity and crash_at in in_flight
    never_claimed = ws.ledger.state_counts()["pending"]
    assert never_claimed >= 17
    crash_mark = len(ws.ledger.events())
    resumed = ws.invoke("resume", "--concurrency", "16")
    assert resumed.exit_code == 0, resumed.output
    # The resume's events about items, numbered in the order they were written.
    events = [
        (n, e.kind, e.item_seq)
        for n, e in enumerate(ws.ledger.events()[crash_mark:])
        if e.item_seq is not None
    ]
    settlement: dict[int, int] = {}
    for seq_no, _kind, item in events:
        if item in in_flight:
            settlement.setdefault(item, seq_no)
    assert set(settlement) == in_flight
    new_starts = [n for n, kind, item in events if kind == "start" and item not in in_flight]
    assert len(new_starts) == never_claimed
    assert min(new_starts) > max(settlement.values())
    assert commits(sandbox) == {key: 1 for key in keys(ws)}


@pytest.mark.parametrize(("channel", "claimed"), [("hooks", 16), ("mail", 4)])
def test_items_are_claimed_ahead_3n_deep_only_where_resume_can_ask_about_them(
    ws: Workspace, sandbox: Sandbox, channel: str, claimed: int
) -> None:
    """At N = 4 the first group commit claims 4 to send and 12 ahead on a queryable channel
    (a kill -9 leaves them for resume to ask about), but on SMTP, where each item a kill -9
    leaves in flight becomes unknown, only the 4 its senders can send at once (one
    connection each, nothing ahead): crashed right after that commit, the database holds
    exactly that many in flight, each with its attempt open."""
    status = f"{sandbox.url}/notifications/{{key}}"
    mail = '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 9\nsender = "o@example.com"'
    configure(ws, sandbox.notifications_url, status_url=status, extra=mail)
    ws.write_csv("batch.csv", make_rows(40))
    send = ("send", "batch.csv", "--channel", channel, "--concurrency", "4")
    crash_invoke(ws, "after-intent:1", *send)
    in_flight = [i.seq for i in ws.ledger.items() if i.state == "in_flight"]
    assert in_flight == list(range(1, claimed + 1))
    assert [a.seq for a in ws.ledger.attempts() if a.finished_at is None] == in_flight
    assert sandbox.stats()["keys"] == {}, "nothing is sent before its point A is committed"


class _SlowOne(BaseHTTPRequestHandler):
    """Answers every POST at once, except item u1's, which it holds for 2 s."""

    answered: list[tuple[str, float]]
    lock = threading.Lock()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        item = json.loads(self.rfile.read(length))["item_id"]
        if item == "u1":
            time.sleep(2.0)
        body = json.dumps({"id": "r-" + item}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        with self.lock:
            self.answered.append((item, time.monotonic()))

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_one_slow_request_does_not_stall_the_others(ws: Workspace) -> None:
    """With item 1 held 2 s at the receiver, the other slots keep sending: at least 50 other
    items are answered before it is."""
    _SlowOne.answered = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowOne)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        configure(ws, f"http://127.0.0.1:{server.server_address[1]}/hook")
        ws.write_csv("batch.csv", make_rows(200))
        result = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", "4")
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 0, result.output
    order = [item for item, _ in _SlowOne.answered]
    assert sorted(order) == sorted(f"u{i}" for i in range(1, 201))
    assert order.index("u1") >= 50


def arrival_span(sandbox: Sandbox) -> float:
    times = sorted(datetime.fromisoformat(d["committed_at"]) for d in sandbox.deliveries())
    return (times[-1] - times[0]).total_seconds()


@pytest.mark.parametrize("sandbox", [Faults()], indirect=True)
def test_rate_50_over_200_items_takes_what_the_bucket_allows(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """--rate 50 with 16 senders: 200 items (a burst of at most 50, then 50/s) arrive over
    no less than 3 s (checked with a generous margin), each once."""
    configure_sandbox(ws, sandbox)
    ws.write_csv("batch.csv", make_rows(200))
    result = ws.invoke(
        "send", "batch.csv", "--channel", "hooks", "--concurrency", "16", "--rate", "50"
    )
    assert result.exit_code == 0, result.output
    assert commits(sandbox) == {key: 1 for key in keys(ws)}
    assert arrival_span(sandbox) >= 2.7
    assert Notifier.open(ws.db).run().options["rate"] == 50


@pytest.mark.parametrize("sandbox", [Faults()], indirect=True)
def test_channel_rate_in_the_config_paces_the_channel(ws: Workspace, sandbox: Sandbox) -> None:
    """`rate = 20` on a channel: 60 items at concurrency 8 arrive over no less than the 2 s
    the bucket allows (burst 20, then 20/s)."""
    configure_sandbox(ws, sandbox, extra="rate = 20")
    ws.write_csv("batch.csv", make_rows(60))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", "8")
    assert result.exit_code == 0, result.output
    assert arrival_span(sandbox) >= 1.7


def test_rate_must_be_positive(ws: Workspace) -> None:
    """`rate = 0` in a channel is refused when the configuration loads, naming the key."""
    configure(ws, "http://127.0.0.1:9/hook", extra="rate = 0")
    ws.write_csv("batch.csv", make_rows(2))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert result.exit_code == 2
    assert "`rate` must be greater than 0" in result.output
