"""A send killed (-9) or signalled (SIGTERM) at N = 1 and N >= 8, and a halt reaching a second
worker process: what is left in flight is what was really under way, what was sent is
recorded, and what follows (resume, cancel) never takes an early 404 as proof. Real
processes; the in-process half is tests/engine/test_every_concurrency.py."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ..conftest import (
    DB_ERRORS,
    SlowRelay,
    Workspace,
    make_rows,
    smtp_server,
    wait_for,
)
from ..engine.test_every_concurrency import (
    CONCURRENCY,
    _assert_nothing_left_open,
    _keys,
    _run_state,
    _states,
)
from ..receiver import WAIT_S, HoldAfter, Receiver, receiving, webhook_config
from ..support.background import meanwhile
from ..support.shared_runs import shared_run

pytestmark = pytest.mark.both_stores


def _start(ws: Workspace, rows: int, n: int, *extra: str) -> subprocess.Popen[str]:
    """`send` as a real process: for the tests that kill or signal it."""
    ws.write_csv("batch.csv", make_rows(rows))
    return ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n), *extra)


def _holders(ws: Workspace) -> int:
    """How many workers hold items in flight (0 before the plan is stored)."""
    try:
        return len({i.worker_id for i in ws.ledger.items() if i.state == "in_flight"})
    except DB_ERRORS:  # not created yet
        return 0


@CONCURRENCY
def test_smtp_killed_leaves_unknown_only_the_message_really_in_flight(
    ws: Workspace, n: int
) -> None:
    """SMTP sends through a pool of at most N connections and claims nothing ahead, so it
    has no queue of claimed items behind it: killed mid-run at any N, at most N items are in
    flight (those the relay is receiving), and resume leaves at most those unknown."""
    relay = SlowRelay()
    with smtp_server(ws, relay):
        ws.write_csv("batch.csv", make_rows(20))
        process = ws.popen("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
        try:
            deadline = time.monotonic() + WAIT_S
            while len(relay.mail_times) < 2:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the relay never got a second message"
                time.sleep(0.02)
        finally:
            process.kill()
            process.communicate()
        assert _states(ws).get("in_flight", 0) <= n, _states(ws)
        # The relay's second per message was there to catch the kill mid-send; what resume
        # does with the in-flight items is what is pinned, not more seconds of relaying.
        relay.seconds = 0.0
        resumed = ws.invoke("resume")
        assert _states(ws).get("unknown", 0) <= n, resumed.output


@CONCURRENCY
def test_sigterm_drains_like_ctrl_c_and_exits_143(ws: Workspace, n: int) -> None:
    """SIGTERM (systemd, docker stop) finishes the requests already sent, records them,
    starts nothing more, pauses the run and exits 143; resume then sends the rest, each key
    committed once."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        process = _start(ws, 40, n)
        try:
            receiver.wait_for(lambda r: len(r.arrivals) >= n)
            process.send_signal(signal.SIGTERM)
            assert process.stdout is not None
            seen = []
            for line in process.stdout:  # said once the signal is handled
                seen.append(line)
                if line.startswith("SIGTERM:"):
                    break
            # The requests under way finish (the receiver answers them) and are recorded.
            hold.set()
            out, err = process.communicate(timeout=60)
            out = "".join(seen) + out
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
        assert process.returncode == 143, out + err
        assert _run_state(ws) == "paused"
        _assert_nothing_left_open(ws)
        sent = set(ws.ledger.keys("sent"))
        assert sent == set(receiver.commits), "every request already sent was recorded"
        assert len(sent) < 40
        # The items claimed ahead (3N at N > 1) never started: back to pending, unattempted.
        released = [a.seq for a in ws.ledger.attempts() if a.outcome == "not_started"]
        assert len(released) == (3 * n if n > 1 else 0)
        pending = {i.seq for i in ws.ledger.items() if i.attempts == 0}
        assert set(released) <= pending
        resumed = ws.invoke("resume")
        assert resumed.exit_code == 0, resumed.output
        assert receiver.commits == dict.fromkeys(_keys(ws), 1)


@CONCURRENCY
@pytest.mark.parametrize("then", ["resume", "cancel"])
@pytest.mark.timeout(90)
def test_after_a_kill_no_early_404_counts_as_proof(ws: Workspace, n: int, then: str) -> None:
    """A receiver that commits 2.5 s after a request arrives (resume) or, past the first two
    waves, only once `cancel` has asked (timeout 3, query_delay 1), killed while items
    claimed ahead were still being started: neither `resume` nor `cancel` takes a 404 as
    proof before timeout + query_delay after each request could have left. Resume commits
    every key exactly once; cancel reports every key the receiver committed as sent or
    unknown, never as pending (never sent)."""
    # For cancel a condition, not a time: on a loaded machine `cancel` may start seconds
    # after the kill, and the requests of the third wave must still be uncommitted then.
    hold = HoldAfter(2 * n) if then == "cancel" else None
    receiver = Receiver(commit_delay_s=2.5 if then == "resume" else 0.0, hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=3, query_delay=1)
        )
        rows = 3 * n if n > 1 else 3
        process = _start(ws, rows, n)
        try:
            # The third wave of requests has arrived: its items were claimed with the first.
            receiver.wait_for(lambda r: len(r.arrivals) > 2 * n)
        finally:
            process.kill()
            process.communicate()
        keys = _keys(ws)
        if then == "resume":
            resumed = ws.invoke("resume")
            assert resumed.exit_code == 0, resumed.output
            receiver.wait_for(lambda r: len(r.commits) == rows)
            assert receiver.commits == dict.fromkeys(keys, 1)
            return
        assert hold is not None

        def commit_once_asked() -> None:
            # Committed once cancel has asked about them (an early 404), inside their
            # window: cancel must not have taken that 404 as proof, and asks again once it
            # counts.
            try:
                receiver.wait_for(lambda r: len(r.queries) > 0)
            finally:
                hold.set()

        with meanwhile(commit_once_asked):
            cancelled = ws.invoke("cancel", "--wait", "5")
        assert cancelled.exit_code in (0, 3), cancelled.output  # 0: every item proved sent
        receiver.wait_for(lambda r: len(r.commits) == len({a.key for a in r.arrivals}))
        states = {i.idempotency_key: i.state for i in ws.ledger.items()}
        assert {states[key] for key in receiver.commits} <= {"sent", "unknown"}, states


@pytest.mark.timeout(90)
def test_a_halt_ends_every_worker_of_a_shared_postgres_run(
    tmp_path: Path, postgres_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers at N = 8 on one PostgreSQL run, both holding items in flight: a 410
    halts the run and both processes end (neither keeps its lease alive spinning), with
    nothing left in flight; a worker that joins afterwards sends nothing and leaves the run
    halted."""
    hold, gone = threading.Event(), threading.Event()
    receiver = Receiver(answer=lambda item, _n: 410 if gone.is_set() else None, hold=hold)
    with shared_run(
        tmp_path, postgres_server, receiver, idempotent=True, status=True, timeout=30
    ) as ws:
        ws.write_csv("batch.csv", make_rows(200))
        first = ws.popen("send", "batch.csv", "--channel", "hooks", "--run-id", "shared",
                         "--concurrency", "8")  # fmt: skip
        try:
            wait_for(lambda: _holders(ws) >= 1, "the first worker sending")
            second = ws.popen("worker", "shared", "--concurrency", "8")
            try:
                wait_for(lambda: _holders(ws) == 2, "both workers holding items")
                gone.set()  # every request from now on is answered 410
                hold.set()
                outcomes = [process.communicate(timeout=60) for process in (first, second)]
            finally:
                second.kill()
        finally:
            hold.set()
            first.kill()
        assert [first.returncode, second.returncode] == [3, 3], outcomes
        assert _run_state(ws) == "halted", outcomes
        _assert_nothing_left_open(ws)
        # A worker joining later does not undo the halt: only `resume` restarts the run.
        arrived = len(receiver.arrivals)
        monkeypatch.chdir(tmp_path)  # the late worker in-process reads this notifier.toml
        late = ws.invoke("worker", "shared", "--concurrency", "8")
        assert late.exit_code == 3, late.output
        assert "halted" in late.stdout, late.output
        assert _run_state(ws) == "halted"
        assert len(receiver.arrivals) == arrived


@pytest.mark.timeout(90)
def test_a_stop_does_not_wait_for_queries_to_a_receiver_that_hangs(ws: Workspace) -> None:
    """At N = 8 against a receiver whose sends and status queries all time out, SIGTERM
    ends the run without querying about each uncertain answer (each query retried may take
    three timeouts): after the signal, no more than the tries under way (one per sender) reach
    the receiver, and the items are left unknown for resume to ask about."""
    receiver = Receiver(commit_delay_s=3, query_delay_s=3)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=1, query_delay=0)
        )
        process = _start(ws, 40, 8)
        try:
            receiver.wait_for(lambda r: len(r.queries) >= 1)  # judging has begun
            process.send_signal(signal.SIGTERM)
            assert process.stdout is not None
            for line in process.stdout:  # said once the signal is handled
                if line.startswith("SIGTERM:"):
                    break
            signalled = time.time()
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 143, out + err
    # Each of the 8 senders may have one try under way, decided before the signal was
    # handled (its arrival may be stamped after `signalled`); none tries again after it
    # (test_no_query_tries_again_once_the_stop_is_seen, in
    # tests/crash/test_a_signal_stops_status_queries_mid_try.py, pins that exactly). Without
    # the check, each would try twice more.
    assert len([t for t in receiver.queries if t > signalled]) <= 8
    _assert_nothing_left_open(ws)
    assert _states(ws).get("unknown", 0) >= 1
