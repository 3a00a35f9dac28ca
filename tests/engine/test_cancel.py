"""Cancel, precisely (and its races): no request starts after the
worker saw the cancel, "never attempted" is true, maybe-delivered retries are settled or
reported unknown, and a cancel racing a completion or a starting send never exits 1."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from notifier.api import Notifier
from notifier.domain import clock
from notifier.domain.state_machine import RunTrigger
from notifier.sandbox.server import Faults, Sandbox
from notifier.store import Store
from notifier.store.ledger import Ledger
from notifier.store.plans import Planning

from ..conftest import DB_ERRORS, SlowRelay, Workspace, make_rows
from ..support.background import Worker
from ..support.crashed import crash_invoke

pytestmark = pytest.mark.both_stores


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def configure_hooks(ws: Workspace, sandbox: Sandbox, *, query: bool, retry: str = "") -> None:
    status = f'status_url = "{sandbox.url}/notifications/{{key}}"\n' if query else ""
    (ws.path / "notifier.toml").write_text(
        f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
        f"{status}idempotent = true\ntimeout = 2\n{retry}"
    )


def finished_attempts(ws: Workspace) -> int:
    try:
        return len([a for a in ws.ledger.attempts() if a.finished_at is not None])
    except DB_ERRORS:  # the worker may not have created the database yet
        return 0


def worker(ws: Workspace, channel: str, concurrency: int = 1) -> Worker:
    """`send batch.csv` as a worker would run it, in a thread of this process (the API
    the command calls): the test cancels while it sends."""
    notifier = Notifier.open(ws.db)
    return Worker(
        lambda: notifier.send(Path("batch.csv"), channel=channel, concurrency=concurrency)
    )


def assert_claimed_nothing_ahead(ws: Workspace, sent: int, *, senders: int) -> None:
    """SMTP claims nothing ahead, so nothing queues behind its senders: every attempt is a
    message the relay got, or the one item a sender had taken up but not yet started when
    it saw the cancel, given back never started (at most one per sender)."""
    outcomes = [a.outcome for a in ws.ledger.attempts()]
    released = outcomes.count("not_started")
    assert len(outcomes) - released == sent, outcomes
    assert released <= senders, outcomes


# ---------------------------------------------------------------------- point 8


def test_no_message_starts_after_cancel_and_unstarted_items_are_released(
    ws: Workspace, slow_relay: SlowRelay
) -> None:
    """With a 1 s relay and --concurrency 4, a cancel during the first message: no MAIL reaches
    the relay after cancel returned, at most those that had passed their check as the cancel
    landed (one per sender) start after the request, and every item not sent was never
    claimed (SMTP claims nothing ahead, so nothing queues behind its senders): pending,
    reported never attempted."""
    ws.write_csv("batch.csv", make_rows(12))
    sending = worker(ws, "mail", 4)
    assert slow_relay.first_mail.wait(60)
    cancelled = ws.invoke("cancel", "--report", "--format", "json")
    returned = time.time()
    # Once the worker has returned it can start nothing more, and each MAIL it sent was
    # noted before its reply, which the worker waited for: nothing more can show.
    assert sending.exit_code() == 3
    assert cancelled.exit_code == 3, cancelled.output
    report = json.loads(cancelled.stdout)
    requested = clock.parse(report["cancel_requested_at"]).timestamp()
    assert [t for t in slow_relay.mail_times if t > returned] == []
    # Each of the 4 senders may have passed its check as the cancel landed (its connection
    # still opening): at most those start after the request.
    assert len([t for t in slow_relay.mail_times if t > requested]) <= 4
    counts = report["counts"]
    assert report["state"] == "cancelled" and counts["in_flight"] == counts["unknown"] == 0
    assert counts["sent"] == len(slow_relay.mail_times)
    assert_claimed_nothing_ahead(ws, counts["sent"], senders=4)
    for item in report["items"]:
        if item["state"] == "pending":
            assert item["attempts"] == 0 and item["pending_kind"] == "never_attempted"
    assert report["pending_detail"]["never_attempted"] == counts["pending"] > 0


def test_cancel_says_plainly_when_the_worker_does_not_confirm_in_time(
    ws: Workspace, slow_relay: SlowRelay
) -> None:
    """A relay taking 4 s per message and `cancel --wait 0.5`: cancel exits 3 saying the worker
    did not confirm in time; the worker then starts nothing more (only the messages already
    in progress, at most one per sender, reached the relay) and closes the run as cancelled."""
    slow_relay.seconds = 4.0
    ws.write_csv("batch.csv", make_rows(6))
    sending = worker(ws, "mail", 3)
    assert slow_relay.first_mail.wait(60)
    cancelled = ws.invoke("cancel", "--wait", "0.5")
    assert sending.exit_code() == 3
    assert cancelled.exit_code == 3, cancelled.output
    assert "did not confirm within 0.5s" in cancelled.output
    assert 1 <= len(slow_relay.mail_times) <= 3
    assert ws.ledger.run().state == "cancelled"
    assert_claimed_nothing_ahead(ws, len(slow_relay.mail_times), senders=3)


# ---------------------------------------------------------------------- point 9

SLOW_RETRY = "[retry]\nmax_attempts = 5\nbackoff_base = 60\nbackoff_max = 60\n"


def send_until_waiting(ws: Workspace, sandbox: Sandbox, attempts: int) -> Worker:
    """A worker that made `attempts` attempts and now waits (a backoff or a Retry-After)."""
    ws.write_csv("batch.csv", make_rows(3))
    sending = worker(ws, "hooks")
    wait_for(lambda: finished_attempts(ws) >= attempts)
    return sending


@pytest.mark.parametrize("query", [False, True], ids=["not-queryable", "queryable"])
def test_cancel_settles_maybe_delivered_retries(ws: Workspace, query: bool) -> None:
    """Every answer is lost after the downstream committed (idempotent channel, so each item
    waits to retry): cancel never calls them "never attempted". A queryable channel settles
    them as sent by query (exit 0, everything was delivered); otherwise they become unknown
    and cancel exits 3."""
    with Sandbox(faults=Faults(drop_rate=1.0)) as sandbox:
        configure_hooks(ws, sandbox, query=query, retry=SLOW_RETRY)
        sending = send_until_waiting(ws, sandbox, 3)
        cancelled = ws.invoke("cancel", "--report", "--format", "json")
        assert sending.exit_code() == (0 if query else 3)
        assert sandbox.stats()["totals"]["commits"] == 3
    report = json.loads(cancelled.stdout)
    counts = report["counts"]
    assert report["pending_detail"] == {
        "never_attempted": 0,
        "retry_waiting": 0,
        "maybe_delivered": 0,
    }
    if query:
        assert cancelled.exit_code == 0, cancelled.output
        assert (counts["sent"], counts["pending"], counts["unknown"]) == (3, 0, 0)
        assert {i["receipt_source"] for i in report["items"]} == {"query"}
    else:
        assert cancelled.exit_code == 3, cancelled.output
        assert (counts["sent"], counts["pending"], counts["unknown"]) == (0, 0, 3)
        assert all("may have been delivered" in i["last_error"] for i in report["items"])


def test_throttled_and_waiting_is_attempted_not_never_attempted(ws: Workspace) -> None:
    """A 429 with a long Retry-After on item 1 gates the channel; cancel reports item 1 as
    attempted and not delivered (retry_waiting), items 2-3 as never attempted; exit 3, since
    none of them will be sent."""
    with Sandbox(faults=Faults(throttle_rate=1.0, retry_after=120)) as sandbox:
        configure_hooks(ws, sandbox, query=True)
        sending = send_until_waiting(ws, sandbox, 1)
        cancelled = ws.invoke("cancel", "--report", "--format", "json")
        assert sending.exit_code() == 3
    assert cancelled.exit_code == 3, cancelled.output
    report = json.loads(cancelled.stdout)
    assert report["counts"]["pending"] == 3
    assert report["pending_detail"] == {
        "never_attempted": 2,
        "retry_waiting": 1,
        "maybe_delivered": 0,
    }
    kinds = {i["seq"]: i["pending_kind"] for i in report["items"]}
    assert kinds == {1: "retry_waiting", 2: "never_attempted", 3: "never_attempted"}
    csv_report = ws.invoke("report", "--format", "csv").output.splitlines()
    header, first = csv_report[0], csv_report[1]
    assert header.endswith(",pending_kind,failed_kind") and first.endswith(",retry_waiting,")


def test_cancel_without_run_id_picks_the_newest_active_run(ws: Workspace) -> None:
    """An older run left running by a crash, then a newer run that completed: `cancel` with no
    RUN_ID cancels the older, unfinished one, not the completed one."""
    with Sandbox() as sandbox:
        configure_hooks(ws, sandbox, query=True)
        ws.write_csv("old.csv", make_rows(3))
        crash_invoke(ws, "after-receipt:1", "send", "old.csv", "--channel", "hooks")
        ws.write_csv("new.csv", make_rows(3, start=10))
        assert ws.invoke("send", "new.csv", "--channel", "hooks").exit_code == 0
        cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 3, cancelled.output
    old, new = ws.ledger.runs()  # oldest first
    assert (old.state, new.state) == ("cancelled", "completed")


# ---------------------------------------------------------------------- races


@pytest.mark.parametrize("when", ["before", "after"])
def test_cancel_racing_a_completion_reports_the_completed_run(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A worker completes the run just before or just after cancel writes its request (forced
    here by completing it around Ledger.request_cancel): cancel says the run is already
    completed and exits 0, never an illegal move (exit 1); the run stays completed."""
    with Sandbox() as sandbox:
        configure_hooks(ws, sandbox, query=True)
        ws.write_csv("batch.csv", make_rows(3))
        # Every item sent, the run left `running`.
        crash_invoke(ws, "after-receipt:3", "send", "batch.csv", "--channel", "hooks")
    run_id = ws.ledger.run().run_id
    original = Ledger.request_cancel

    def complete() -> None:
        other = Store.open(ws.db)
        try:
            other.ledger.move_run(run_id, RunTrigger.COMPLETE)
        finally:
            other.close()

    def racing(self: Ledger, rid: str) -> Any:
        if when == "before":
            complete()
        result = original(self, rid)
        if when == "after":
            complete()
        return result

    monkeypatch.setattr(Ledger, "request_cancel", racing)
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 0, cancelled.output
    assert "already completed" in cancelled.output
    assert ws.ledger.run().state == "completed"


CANCEL_AS_SOON_AS_PLANNED = """
import sqlite3, sys, time
import psycopg
from notifier.cli import cli
db = sys.argv[1]

def planned():
    if db.startswith("postgresql://"):
        with psycopg.connect(db, autocommit=True) as conn:
            return conn.execute("SELECT MAX(run_id) FROM runs").fetchone()[0]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT MAX(run_id) FROM runs").fetchone()[0]
    finally:
        conn.close()

open(sys.argv[2], "w").close()  # the test starts the send only once this exists
deadline = time.monotonic() + 60
run_id = None
while time.monotonic() < deadline and run_id is None:
    try:
        run_id = planned()
    except (sqlite3.Error, psycopg.Error):  # not created yet
        pass
    time.sleep(0.001)
# By its id: the send may already have completed it (then there is nothing to cancel).
cli(["--db", db, "cancel", run_id])
"""


def started_polling(marker: Path, canceller: subprocess.Popen[str]) -> bool:
    """The canceller wrote its marker (it is polling), or exited (to be reported)."""
    return marker.exists() or canceller.poll() is not None


# Six trials, each a test of its own so that xdist's workers run them side by side.


def test_send_whose_run_was_cancelled_before_it_took_the_lease(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of that race, forced: a `cancel` process closes the run right after
    `send` stored its plan and before it takes the lease. The send then finds the run
    cancelled, sends nothing and exits 3 (not 1); the cancel exited 0."""
    original = Planning.create_run
    cancels: list[Result] = []

    def planned_then_cancelled(
        self: Planning, run: dict[str, Any], items: Any, **options: Any
    ) -> None:
        original(self, run, items, **options)
        cancels.append(ws.invoke("cancel"))  # the command, run in the middle of the send

    with Sandbox() as sandbox:
        configure_hooks(ws, sandbox, query=True)
        ws.write_csv("batch.csv", make_rows(3))
        monkeypatch.setattr(Planning, "create_run", planned_then_cancelled)
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
        assert sandbox.stats()["totals"]["requests"] == 0
    assert [c.exit_code for c in cancels] == [3], cancels[0].output
    assert sent.exit_code == 3, sent.output
    assert "already cancelled; nothing was sent" in sent.output
    assert ws.ledger.run().state == "cancelled"
