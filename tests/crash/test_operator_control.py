"""Operator control against real worker processes: cancel against a live worker and a dead
one, leases (two resumes, kill -9, expiry), and Ctrl-C (docs/design.md sections 8, 9 and 11).
The worker that is killed, signalled or contended with is a process; the command that
follows it (cancel, resume) runs in-process."""

from __future__ import annotations

import functools
import json
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from notifier.domain import clock
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import DB_ERRORS, SlowRelay, Workspace, make_rows
from ..support.crashed import crash_send

pytestmark = pytest.mark.both_stores


@pytest.fixture
def slow_sandbox() -> Iterator[Sandbox]:
    with Sandbox(faults=Faults(latency_ms=50)) as running:
        yield running


def configure(ws: Workspace, sandbox: Sandbox) -> None:
    (ws.path / "notifier.toml").write_text(
        "[channels.hooks]\n"
        'type = "webhook"\n'
        f'url = "{sandbox.notifications_url}"\n'
        f'status_url = "{sandbox.url}/notifications/{{key}}"\n'
        "idempotent = true\n"
    )


def committed_keys(sandbox: Sandbox) -> set[str]:
    return {k for k, v in sandbox.stats()["keys"].items() if v["commits"]}


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def sent_count(ws: Workspace) -> int:
    try:
        return ws.ledger.state_counts().get("sent", 0)
    except DB_ERRORS:  # not created yet
        return 0


def has_sent_or_ended(ws: Workspace, worker: subprocess.Popen[str], at_least: int) -> bool:
    return worker.poll() is not None or sent_count(ws) >= at_least


def assert_each_key_committed_once(ws: Workspace, sandbox: Sandbox) -> None:
    stats = sandbox.stats()["keys"]
    for item in ws.ledger.items():
        assert stats[item.idempotency_key]["commits"] == 1, item.item_id


@pytest.mark.parametrize("concurrency", ["1", "16"])
def test_cancel_against_a_live_worker_stops_dispatch_and_reports_exactly(
    ws: Workspace, slow_sandbox: Sandbox, concurrency: str
) -> None:
    """While a worker sends 1000 items at 50 ms each, one at a time or 16 at once,
    `cancel --report` returns only after the worker stopped: the sandbox receives nothing
    afterwards, the counts add up to 1000, and the report's sent list is exactly what the
    sandbox committed."""
    configure(ws, slow_sandbox)
    ws.write_csv("batch.csv", make_rows(1000))
    worker = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", concurrency)
    try:
        wait_for(lambda: sent_count(ws) >= 10)
        # In-process: what is pinned is that cancel returns only once the worker, another
        # process, has stopped sending.
        cancelled = ws.invoke("cancel", "--report", "--format", "json")
        after_cancel = slow_sandbox.stats()["totals"]
        # Once the worker has exited nothing more can come from it: whatever reached the
        # sandbox since cancel returned is in its totals by now.
        assert worker.wait(timeout=60) in (0, 3)
        assert slow_sandbox.stats()["totals"] == after_cancel
        assert cancelled.exit_code == 3, cancelled.output  # the rest will never be sent
        report = json.loads(cancelled.stdout)
        assert report["state"] == "cancelled"
        counts = report["counts"]
        assert counts["sent"] + counts["pending"] + counts["unknown"] + counts["failed"] == 1000
        assert counts["in_flight"] == 0 and counts["unknown"] == 0
        assert 10 <= counts["sent"] < 1000
        sent = {i["idempotency_key"] for i in report["items"] if i["state"] == "sent"}
        assert sent == committed_keys(slow_sandbox)
        assert worker.wait(timeout=30) == 3
    finally:
        worker.kill()
        worker.wait()


def test_cancel_without_a_worker_settles_in_flight_by_query(
    ws: Workspace, slow_sandbox: Sandbox
) -> None:
    """After a crash with item 20 delivered but unrecorded, cancel settles it by query (never
    re-posting it) and reports 20 sent, 0 unknown, 80 pending."""
    configure(ws, slow_sandbox)
    ws.write_csv("batch.csv", make_rows(100))
    crash_send("after-send:20", db=ws.db, channel="hooks")
    cancelled = ws.invoke("cancel", "--report", "--format", "json")
    assert cancelled.exit_code == 3, cancelled.output  # 80 will never be sent
    report = json.loads(cancelled.stdout)
    assert (report["counts"]["sent"], report["counts"]["unknown"], report["counts"]["pending"]) == (
        20, 0, 80,
    )  # fmt: skip
    key20 = next(i["idempotency_key"] for i in report["items"] if i["seq"] == 20)
    assert slow_sandbox.stats()["keys"][key20] == {"commits": 1, "replays": 0, "refused": 0}
    assert len(committed_keys(slow_sandbox)) == 20
    again = ws.invoke("resume")
    assert again.exit_code == 2  # a cancelled run is never resumed by default


def test_two_resumes_one_works_the_other_is_refused(ws: Workspace, slow_sandbox: Sandbox) -> None:
    """Two `resume` processes on one run: on SQLite exactly one works, the other exits 4
    naming the lease holder; on PostgreSQL the second joins as another worker, and the one
    that leaves the run to the other still sending it exits 3 (stopped, not done), the
    other 0. Either way no key is committed twice."""
    configure(ws, slow_sandbox)
    ws.write_csv("batch.csv", make_rows(60))
    crash_send("after-receipt:5", db=ws.db, channel="hooks")
    first = ws.popen("resume")
    try:
        wait_for(lambda: sent_count(ws) >= 8)
        second = ws.run("resume")
        if ws.url:  # a shared run: both work it; the last to finish closes it
            out, err = first.communicate(timeout=60)
            ended = sorted([(first.returncode, out + err),
                            (second.returncode, second.stdout + second.stderr)])  # fmt: skip
            assert ended[0][0] == 0 and ended[1][0] in (0, 3), ended
            assert ended[1][0] == 0 or "still being sent by the other live workers" in ended[1][1]
        else:
            assert second.returncode == 4, second.stdout + second.stderr
            assert f"pid {first.pid}" in second.stderr and socket.gethostname() in second.stderr
            assert first.wait(timeout=60) == 0
    finally:
        first.kill()
        first.wait()
    assert_each_key_committed_once(ws, slow_sandbox)
    assert len(committed_keys(slow_sandbox)) == 60


def test_kill_9_then_resume_takes_over_and_completes(ws: Workspace, slow_sandbox: Sandbox) -> None:
    """A worker killed with SIGKILL mid-run leaves a dead lease; resume takes over at once
    (same host, process gone), settles what was in flight, and delivers each key once."""
    configure(ws, slow_sandbox)
    ws.write_csv("batch.csv", make_rows(80))
    worker = ws.popen("send", "batch.csv", "--channel", "hooks")
    wait_for(lambda: sent_count(ws) >= 15)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    # The dead worker still holds the run on paper: its run lease, or its worker lease.
    if ws.url:
        assert ws.ledger.live_worker_pids() == [worker.pid]
    else:
        assert json.loads(ws.ledger.lease_owner() or "{}")["pid"] == worker.pid
    resumed = ws.invoke("resume")  # in-process: the holder it must find dead is the worker
    assert resumed.exit_code == 0, resumed.output
    assert_each_key_committed_once(ws, slow_sandbox)
    assert ws.status()["counts"]["sent"] == 80


def test_lease_from_another_host_blocks_until_it_expires(ws: Workspace) -> None:
    """A lease held on another machine is honoured until its expiry, then taken over."""
    ws.write_csv("batch.csv", make_rows(5))
    crash_send("after-receipt:2", db=ws.db)
    owner = {"host": "other-host.example", "pid": 4242, "token": "t"}

    def hold(seconds: float) -> None:
        ws.forge.lease_held_by(owner, clock.iso(clock.later(seconds)))

    hold(600)
    refused = ws.invoke("resume")
    assert refused.exit_code == 4
    assert "pid 4242 on other-host.example" in refused.output
    hold(-1)
    assert ws.invoke("resume").exit_code == 0
    assert ws.status()["counts"]["sent"] == 5


def test_ctrl_c_pauses_cleanly_and_resume_completes(ws: Workspace, slow_sandbox: Sandbox) -> None:
    """SIGINT mid-run: requests already sent are recorded, the run is paused, exit 130;
    resume completes; each key committed once."""
    configure(ws, slow_sandbox)
    ws.write_csv("batch.csv", make_rows(80))
    worker = ws.popen("send", "batch.csv", "--channel", "hooks")
    wait_for(lambda: sent_count(ws) >= 10)
    worker.send_signal(signal.SIGINT)
    try:
        assert worker.wait(timeout=30) == 130
    except subprocess.TimeoutExpired:
        worker.kill()
        raise
    status = ws.status()
    assert status["state"] == "paused"
    assert status["counts"]["in_flight"] == 0
    assert set(committed_keys(slow_sandbox)) == {
        i["idempotency_key"] for i in status["items"] if i["state"] == "sent"
    }
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert_each_key_committed_once(ws, slow_sandbox)
    assert ws.status()["counts"]["sent"] == 80


def test_ctrl_c_during_smtp_at_concurrency_4_leaves_the_rest_never_attempted(
    ws: Workspace, slow_relay: SlowRelay
) -> None:
    """With a 1 s relay and --concurrency 4 (SMTP claims one item per sender and nothing
    behind them), Ctrl-C during the first message: only the (at most 4) messages whose
    senders had started may reach the relay, the run is paused (exit 130) with nothing in
    flight, the other items are pending with no attempt at all, and resume sends each of
    them once."""
    ws.write_csv("batch.csv", make_rows(8))
    worker = ws.popen("send", "batch.csv", "--channel", "mail", "--concurrency", "4")
    try:
        assert slow_relay.first_mail.wait(60)
        worker.send_signal(signal.SIGINT)
        interrupted = time.time()
        assert worker.wait(timeout=60) == 130, worker.stderr.read() if worker.stderr else ""
    finally:
        worker.kill()
        worker.wait()
    # The other senders may still have been opening their connections as the signal came.
    assert len([t for t in slow_relay.mail_times if t > interrupted]) <= 3
    status = ws.status()
    counts = status["counts"]
    assert status["state"] == "paused" and counts["in_flight"] == counts["unknown"] == 0
    started = len(slow_relay.mail_times)
    assert counts["sent"] == started and 1 <= started <= 4
    pending = [i for i in status["items"] if i["state"] == "pending"]
    assert len(pending) == 8 - started and all(i["attempts"] == 0 for i in pending)
    # A sender that had connected when the signal came withholds its message (its claim's
    # attempt closed `not_started`, never counted): only the messages that left are attempts.
    started_attempts = [a for a in ws.ledger.attempts() if a.outcome != "not_started"]
    assert len(started_attempts) == started, "only those started"
    slow_relay.seconds = 0
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(slow_relay.mail_times) == 8
    assert ws.status()["counts"]["sent"] == 8


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_chaos_sigkill_at_random_moments_still_delivers_each_key_once(
    ws: Workspace, seed: int, fast_waits: float
) -> None:
    """Kill -9 the worker at random moments, resume, repeat: every notification ends up
    delivered exactly once and the database stays consistent (it opens without complaint)."""
    rng = random.Random(seed)
    faults = Faults(seed=seed, latency_ms=10, drop_rate=0.05, fail_rate=0.05)
    with Sandbox(faults=faults) as sandbox:
        configure(ws, sandbox)
        (ws.path / "notifier.toml").write_text(
            (ws.path / "notifier.toml").read_text()
            + "[retry]\nmax_attempts = 20\nbackoff_base = 0.01\nbackoff_max = 0.05\n"
        )
        ws.write_csv("batch.csv", make_rows(400))
        send = ("send", "batch.csv", "--channel", "hooks", "--concurrency", "4")
        # The kills land at random points of the run's progress, not at random times: a
        # loaded machine (slow start-up) would otherwise kill every process before it sent
        # anything, and a fast one finish before the first kill. Each process is killed once
        # the drawn number of items is sent: right at its start when an earlier process got
        # that far already (a kill during start-up or settling), else among its sends.
        for mark in sorted(rng.sample(range(20, 380), 8)):
            worker = ws.popen(*(("resume",) if ws.has_database() else send))
            wait_for(functools.partial(has_sent_or_ended, ws, worker, mark), timeout=60)
            assert worker.poll() is None, f"the run ended before {mark} were sent"
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        # Whatever the last kill left, one resume settles it and finishes the run.
        worker = ws.popen("resume")
        code = worker.wait(timeout=90)
        assert code == 0, (worker.stdout.read() if worker.stdout else "") + (
            worker.stderr.read() if worker.stderr else ""
        )
        assert ws.status()["counts"]["sent"] == 400
        assert_each_key_committed_once(ws, sandbox)
