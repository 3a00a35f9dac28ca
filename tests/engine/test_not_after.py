"""Deadlines: an item whose not_after passed before its turn is `expired`, never sent."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from notifier.api import Notifier
from notifier.domain import clock
from notifier.engine.judging import NotStarted
from notifier.engine.run_control import Stop
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows, smtp_server
from ..support.crashed import crash_send
from ..support.held import WAIT_S, Answered, HeldRun
from ..support.smtp import HeldGreeting


def iso_in(seconds: float, timespec: str = "seconds") -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec=timespec)


def test_rows_past_their_deadline_when_resumed_are_expired_and_never_sent(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped after two items and resumed after rows 3 and 4 passed their not_after:
    those two become expired and are never sent; the others are sent; reports count them.
    The resume runs with its clock an hour on (clock.SHIFT_ENV), so the deadlines pass
    between the two runs whatever the first run's pace, with no wait."""
    soon, later = iso_in(1800), iso_in(3 * 3600)
    rows = [["id", "to", "subject", "body", "not_after"]]
    deadlines = ["", "", soon, soon, "", later]
    for i, deadline in enumerate(deadlines, start=1):
        rows.append([f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}", deadline])
    batch = ws.write_csv("b.csv", rows)
    crash_send("after-receipt:2", batch, db=ws.db)

    # In-process, its clock an hour on (the switch clock.SHIFT_ENV sets for a process).
    monkeypatch.setattr(clock, "_SHIFT", timedelta(seconds=3600))
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 3, resumed.output  # expired: never sent
    assert "2 pending item(s) are already past their not_after" in resumed.stdout
    assert "2 expired" in resumed.stdout
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == ["u1", "u2", "u5", "u6"]
    states = ws.ledger.states()
    assert states["u3"] == states["u4"] == "expired"
    assert ws.ledger.attempts(seq=3) == ws.ledger.attempts(seq=4) == []
    report = ws.status()
    assert report["counts"]["expired"] == 2 and report["counts"]["sent"] == 4
    table = ws.invoke("report")
    assert "expired" in table.output


def test_not_after_option_in_the_past_is_refused_unless_allowed(ws: Workspace) -> None:
    """A --not-after already past is a usage error (exit 2, nothing stored): every item
    would expire unsent. With --allow-expired, every item expires at its turn; nothing is
    sent."""
    batch = ws.write_csv("b.csv", make_rows(3))
    refused = ws.invoke("send", str(batch), "--not-after", "2020-01-01T00:00:00Z")
    assert refused.exit_code == 2, refused.output
    assert "already past" in refused.output and "--allow-expired" in refused.output
    assert not ws.db_file.exists()
    result = ws.invoke("send", str(batch), "--not-after", "2020-01-01T00:00:00Z", "--allow-expired")
    assert result.exit_code == 3, result.output
    assert ws.outbox_documents() == []
    assert ws.status()["counts"]["expired"] == 3


def test_the_deadline_is_part_of_the_digested_intent(ws: Workspace) -> None:
    """The deadline is in the stored payload, so the same rows with another deadline are
    another batch (another fingerprint), and a row's own not_after may only be earlier."""
    rows = make_rows(2)
    rows[0].append("not_after")
    rows[1].append("2030-01-01T10:00:00+02:00")
    rows[2].append("")
    batch = ws.write_csv("b.csv", rows)
    first = ws.invoke("send", str(batch), "--not-after", "2031-01-01T00:00:00Z", "--dry-run")
    second = ws.invoke("send", str(batch), "--not-after", "2032-01-01T00:00:00Z", "--dry-run")
    assert first.exit_code == second.exit_code == 0
    fingerprint = [line for line in first.output.splitlines() if "fingerprint" in line]
    assert fingerprint and fingerprint[0] not in second.output
    sent = ws.invoke("send", str(batch), "--not-after", "2031-01-01T00:00:00Z")
    assert sent.exit_code == 0, sent.output
    notifier = Notifier.open(ws.db)
    payloads = [item.payload for item in notifier.items(notifier.run().run_id)]
    assert payloads[0]["not_after"] == "2030-01-01T08:00:00.000000+00:00"
    assert payloads[1]["not_after"] == "2031-01-01T00:00:00.000000+00:00"
    assert "not_after" not in payloads[0]["data"]


def test_a_deadline_without_a_zone_is_rejected_with_its_line(ws: Workspace) -> None:
    """A not_after without a time zone is a problem of that line: exit 2, nothing stored."""
    rows = make_rows(2)
    rows[0].append("not_after")
    rows[1].append("2030-01-01T10:00:00")
    rows[2].append("tomorrow")
    batch = ws.write_csv("b.csv", rows)
    result = ws.invoke("send", str(batch))
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and "line 3" in result.output
    assert not ws.db_file.exists()
    bad = ws.invoke("send", str(batch), "--not-after", "2030-01-01 10:00")
    assert bad.exit_code == 2 and "zone" in bad.output


def test_a_deadline_passing_after_an_uncertain_attempt_leaves_the_item_unknown(
    ws: Workspace,
) -> None:
    """An item whose last attempt may have been delivered (500 on an idempotent webhook) is
    not expired blindly when its deadline passes: it becomes unknown, to be settled, and no
    attempt starts after the deadline."""
    with Sandbox(faults=Faults(force_status={"u1": 500})) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            "idempotent = true\ntimeout = 5\n"
            "[retry]\nmax_attempts = 1000\nbackoff_base = 0.05\nbackoff_max = 0.2\n"
        )
        deadline = iso_in(2)
        rows = [
            ["id", "to", "subject", "body", "not_after"],
            ["u1", "a@x.example", "S", "B", deadline],
        ]
        result = ws.invoke("send", str(ws.write_csv("b.csv", rows)), "--channel", "hooks")
    assert result.exit_code == 3, result.output
    (item,) = ws.ledger.items()
    assert item.state == "unknown" and "may have been delivered" in (item.last_error or "")
    attempts = [(a.started_at, a.outcome) for a in ws.ledger.attempts()]
    assert len(attempts) >= 2 and attempts[-1][1] == "expired"
    outcomes = [outcome for _, outcome in attempts[:-1]]
    # On a loaded machine the deadline may pass between a claim and its request: that claim
    # is released unsent (not_started); none is sent after the deadline either way.
    assert outcomes[0] == "uncertain" and set(outcomes) <= {"uncertain", "not_started"}
    limit = datetime.fromisoformat(deadline)
    assert all(datetime.fromisoformat(started) < limit for started, _ in attempts[:-1])


def test_an_item_that_waits_past_its_deadline_for_a_free_sender_is_never_sent(
    ws: Workspace,
) -> None:
    """At N = 2 against a receiver taking 2.5 s, the items claimed ahead before a 1.5 s
    deadline still wait for a sender when it passes: none of them starts after it (the
    check before each send covers the deadline too); they end expired, never attempted."""
    with Sandbox(faults=Faults(latency_ms=2500)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            "timeout = 10\n"
        )
        deadline = iso_in(1.5, "microseconds")
        rows = [["id", "to", "subject", "body", "not_after"]]
        rows += [[f"u{i}", f"user{i}@example.com", "S", "B", deadline] for i in range(1, 7)]
        result = ws.invoke(
            "send", str(ws.write_csv("b.csv", rows)), "--channel", "hooks", "--concurrency", "2"
        )
        delivered = sorted(d["body"]["item_id"] for d in sandbox.deliveries())
        requests = sandbox.stats()["totals"]["requests"]
    assert result.exit_code == 3, result.output
    assert delivered == ["u1", "u2"] and requests == 2
    states = ws.ledger.states()
    assert states == {"u1": "sent", "u2": "sent", **{f"u{i}": "expired" for i in range(3, 7)}}
    limit = datetime.fromisoformat(deadline)
    # Attempts closed as not_started or expired never sent a request.
    sent = [
        a.started_at for a in ws.ledger.attempts() if a.outcome not in ("not_started", "expired")
    ]
    assert len(sent) == 2 and all(datetime.fromisoformat(at) < limit for at in sent)


class _UncertainThenThrottled(BaseHTTPRequestHandler):
    """The first POST gets a 500 (it may have been delivered), every later one a 429."""

    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).posts += 1
        self.send_response(500 if type(self).posts == 1 else 429)
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_deadline_passing_after_an_uncertain_then_a_throttled_attempt_leaves_it_unknown(
    ws: Workspace,
) -> None:
    """A 429 after a 500 proves nothing about the 500's request: when the deadline passes the
    item is unknown, to be settled, not expired as never sent (its last attempt alone was
    never delivered)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _UncertainThenThrottled)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:{server.server_port}/n"'
            "\nidempotent = true\ntimeout = 5\n"
            "[retry]\nmax_attempts = 1000\nbackoff_base = 0.05\nbackoff_max = 0.2\n"
        )
        rows = [["id", "to", "subject", "body", "not_after"], ["u1", "a@x.example", "S", "B"]]
        rows[1].append(iso_in(2, "microseconds"))
        result = ws.invoke("send", str(ws.write_csv("b.csv", rows)), "--channel", "hooks")
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 3, result.output
    (item,) = ws.ledger.items()
    assert item.state == "unknown" and "may have been delivered" in (item.last_error or "")
    outcomes = [a.outcome for a in ws.ledger.attempts()]
    assert outcomes[0] == "uncertain" and "throttled" in outcomes


@pytest.mark.both_stores
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.timeout(60)
def test_a_deadline_passing_while_the_relay_greets_sends_nothing(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items' not_after passes while every sender waits for the relay's greeting (EHLO
    held until all N wait at it; meanwhile this process's clock moves two hours on, past
    the deadline an hour ahead): once the connection is ready, the last check before MAIL
    FROM sees the deadline passed, so the relay accepts no message, every item ends
    expired and no attempt of them was ever started."""

    def deadline_passes() -> None:
        monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))

    relay = HeldGreeting(n, deadline_passes)
    with smtp_server(ws, relay, "timeout = 60\n"):
        rows = [["id", "to", "subject", "body", "not_after"]]
        rows += [[f"u{i}", f"user{i}@example.com", "S", "B", iso_in(3600)] for i in range(1, n + 1)]
        result = ws.invoke(
            "send", str(ws.write_csv("b.csv", rows)), "--channel", "mail", "--concurrency", str(n)
        )
    assert relay.most_waiting == n, "not every sender was mid-greeting when the deadline passed"
    assert result.exit_code == 3, result.output
    assert relay.messages == [], "a message was handed over after its not_after"
    assert ws.ledger.state_counts() == {"expired": n}
    outcomes = {a.outcome for a in ws.ledger.attempts()}
    assert outcomes <= {"not_started", "expired"}, outcomes


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_no_item_claimed_ahead_starts_after_its_not_after(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At N = 8 with 3N claimed ahead (a channel that can be asked): the items' not_after
    passes while the first N requests are under way (this process's clock moves two hours
    on); the senders that free up find the 3N queued items past it and start none of
    them: released never attempted, then expired."""
    n = 8
    channel = Answered()
    run = HeldRun(ws, channel, n, 4 * n, not_after=clock.iso(clock.later(3600)))
    run.thread.start()
    try:
        channel.wait_started(n)
        monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))
        passed = time.monotonic()
        channel.let_all_go()
        assert run.held.reached.wait(WAIT_S), "no answer reached the committer"
        run.wait_taken(4 * n)
    finally:
        result = run.finish(channel)
    assert [item for item, at in channel.started if at > passed] == []
    assert len(channel.started) == n
    assert sum(isinstance(r, NotStarted) for r in run.taken) == 3 * n
    assert result.stop is Stop.COMPLETED, result
    assert ws.ledger.state_counts() == {"expired": 3 * n, "sent": n}
