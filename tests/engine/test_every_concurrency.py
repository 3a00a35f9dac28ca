"""The promises at every concurrency: each test runs at N = 1 and at N = 8 with
items claimed ahead, on both stores, through the real CLI against a receiver on 127.0.0.1
(tests/receiver.py), or through the real Runner where only the order of events matters.
The real processes killed or signalled at every concurrency:
tests/crash/test_kills_and_signals_at_every_concurrency.py."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from notifier.channels import Ready, always
from notifier.cli.outcome import run_advice, run_exit
from notifier.domain import clock, waits
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent
from notifier.domain.records import Item, StopCause
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import RunState, RunTrigger
from notifier.engine.crash import CrashPlan
from notifier.engine.judging import SendResult
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.runner import APPROVAL_PAUSE, CHANNEL_DOWN_PAUSE, Runner, RunOptions, RunResult
from notifier.engine.sending import Asked
from notifier.engine.settle_by_query import Question
from notifier.store import Store

from ..conftest import (
    Workspace,
    make_rows,
    wait_for,
)
from ..receiver import WAIT_S, Receiver, receiving, webhook_config
from ..support.background import meanwhile
from ..support.held import Answered, HeldRun

pytestmark = pytest.mark.both_stores
CONCURRENCY = pytest.mark.parametrize("n", [1, 8])


def _send(ws: Workspace, rows: int, n: int, *extra: str) -> Result:
    """`send` in-process (CliRunner): the same command, exit code and output, no start-up."""
    ws.write_csv("batch.csv", make_rows(rows))
    return ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n), *extra)


def _states(ws: Workspace) -> dict[str, int]:
    return ws.ledger.state_counts()


def _run_state(ws: Workspace) -> str:
    return ws.ledger.run().state


def _judged(ws: Workspace, item_id: str) -> bool:
    """Whether the committer has recorded an answer for `item_id` (no longer in flight)."""
    items = [i for i in ws.ledger.items() if i.item_id == item_id]
    return bool(items) and items[0].state not in ("pending", "in_flight")


def _assert_nothing_left_open(ws: Workspace) -> None:
    assert "in_flight" not in _states(ws), _states(ws)
    assert [a.seq for a in ws.ledger.attempts() if a.finished_at is None] == []


def _keys(ws: Workspace) -> set[str]:
    return set(ws.ledger.keys())


@CONCURRENCY
@pytest.mark.parametrize(
    ("answer", "idempotent", "exit_code"),
    [(410, True, 3), (422, True, 4), (500, False, 3)],
    ids=["gone", "conflict", "five-unknowns"],
)
def test_a_halting_answer_ends_the_run_at_every_concurrency(
    ws: Workspace, n: int, answer: int, idempotent: bool, exit_code: int
) -> None:
    """A 410, a 422, or five unknowns in a row on a channel that can't be asked halts the
    run and ends the process at any N: the requests in flight are recorded, nothing is left
    in flight, the rest stays pending, and `cancel` then closes the run. Unknowns no query
    can settle are pointed to `reconcile --manual`."""
    scripted = {"u3"} if answer != 500 else None

    def answer_for(item: str, _n: int) -> int | None:
        if scripted is None or item in scripted:
            return answer
        if int(item[1:]) > 3:
            # Items after u3 are answered once u3's answer is judged: a busy machine that
            # delays u3's answer cannot let the other senders finish the batch before it.
            wait_for(lambda: _judged(ws, "u3"), "u3's answer judged", timeout=WAIT_S)
        return None

    receiver = Receiver(answer=answer_for)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=idempotent, status=idempotent)
        )
        result = _send(ws, 60, n)
        out = result.output
        assert result.exit_code == exit_code, out
        assert "halted" in out, out
        if answer == 500:  # unknowns on a channel that cannot be asked: settled by hand
            assert f"notifier reconcile --manual {ws.ledger.run().run_id}" in out, out
        assert _run_state(ws) == "halted"
        _assert_nothing_left_open(ws)
        assert _states(ws).get("pending", 0) > 0, "nothing new starts once the run halts"
        cancelled = ws.invoke("cancel", "--wait", "10")
        assert cancelled.exit_code == 3, cancelled.output
        assert _run_state(ws) == "cancelled"


@CONCURRENCY
@pytest.mark.timeout(60)
def test_a_replay_no_attempt_of_ours_explains_leaves_the_item_unknown_and_halts(
    ws: Workspace, n: int
) -> None:
    """An item's first attempt answered "replayed" (our own digest echoed back), at N = 1
    and at 8 with 3N claimed ahead, the committer held before it judges the answer: the
    item is left unknown (maybe delivered: its attempt `uncertain`, no receipt), never
    sent nor failed; the run halts as for a conflict (exit 4) with its advice naming the
    reconcile that settles it; the N - 1 requests under way are recorded, and no request
    starts after the replay came: every item claimed ahead is released never attempted."""

    def answer(item: str) -> Receipt | ChannelError:
        if item == "1":
            return Receipt("r-earlier", f"sha256:{item}", replayed=True)
        return Receipt("r-" + item, f"sha256:{item}")

    channel = Answered(answer=answer)
    run = HeldRun(ws, channel, n, 4 * n)
    run.thread.start()
    try:
        channel.wait_started(n)
        channel.let_go("1")
        assert run.held.reached.wait(WAIT_S), "the replay never reached the committer"
        channel.let_all_go()
        run.wait_taken(4 * n if n > 1 else 1)
    finally:
        result = run.finish(channel)
    replayed_at = channel.answered["1"]
    assert [item for item, at in channel.started if at > replayed_at] == []
    assert len(channel.started) == n
    assert result.stop is Stop.CONFLICT, result
    assert run_exit(result) == 4
    assert "notifier reconcile r1" in run_advice(result, "r1", "notifier send b.csv")
    assert _run_state(ws) == "halted"
    first = ws.ledger.item("1")
    assert first.state == "unknown" and first.receipt_id is None, first
    assert "replay" in (first.last_error or ""), first
    assert [a.outcome for a in ws.ledger.attempts(first.seq)] == ["uncertain"]
    assert result.counts.unknown == 1 and result.counts.sent == n - 1, result.counts
    assert ws.ledger.receipt_count() == n - 1
    never = [i for i in ws.ledger.items() if i.state == "pending" and i.attempts == 0]
    assert len(never) == 3 * n
    _assert_nothing_left_open(ws)


@dataclass
class _Throttling:
    """A downstream whose item `throttled` answers 429 (Retry-After 1 s) once; every other
    request waits for `release` (the wire does not matter here: only the order of events)."""

    throttled: str
    name: str = "hooks"
    idempotent: bool = True
    queryable: bool = True
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    starts: list[tuple[str, float]] = field(default_factory=list)
    throttled_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        with self.lock:
            self.starts.append((intent.item_id, time.monotonic()))
            first = intent.item_id == self.throttled and not self.throttled_at
            if first:
                self.throttled_at = time.monotonic()
        if first:
            raise ChannelError(ErrorKind.THROTTLED, "HTTP 429", http_status=429, retry_after=1.0)
        self.release.wait(WAIT_S)
        return Receipt("r-" + intent.item_id, intent.intent_digest)

    def query(self, key: str) -> Receipt | None:
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _HeldCommitter(CrashPlan):
    """Holds the committer when it takes up item `seq`'s result, before it judges it."""

    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def at(self, point: str, seqs: object) -> None:
        if point == "after-send" and self.seq in seqs:  # type: ignore[operator]
            self.reached.set()
            self.go.wait(WAIT_S)


def _planned_run(ws: Workspace, items: int) -> Store:
    store = Store.open(ws.db, create=True)
    store.plans.create_run(
        {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(), "batch_path": "b",
         "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
         "contract_version": "v1"},
        [{"run_id": "r1", "seq": i, "item_id": str(i), "channel": "hooks",
          "target": f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
          "intent_digest": f"sha256:{i}"} for i in range(1, items + 1)],
    )  # fmt: skip
    return store


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.timeout(60)
def test_a_throttled_answer_closes_the_channel_before_any_other_sender_starts(
    ws: Workspace, n: int, fast_waits: float
) -> None:
    """At N = 4 and 8, with items claimed ahead: once a 429 with Retry-After has arrived, no
    other request of its channel starts until Retry-After (as the test switch scales it)
    has passed, even while the committer has not yet judged the 429 and the other senders
    free up and find claimed items waiting."""
    items = n + 3 * n  # the senders' N plus the 3N claimed ahead: one claim takes them all
    store = _planned_run(ws, items)
    # The last of the first N to start answers 429.
    channel = _Throttling(throttled=str(n))
    held = _HeldCommitter("after-send", n)
    version = store.leases.acquire_lease("r1", {"host": "h", "pid": os.getpid()}, 30, holder_alive)
    runner = Runner(
        store, store.core.get_run("r1"),
        {"hooks": channel}, RetryPolicy.from_settings(5, 60, 0.01, 0.05),
        RunOptions(concurrency=n), lease_version=version, control=RunControl(),
        crash=held, say=lambda line: None,
    )  # fmt: skip
    taken = []  # every claimed item goes through one sender call: sent, or held back
    send_one = runner._senders._send

    def counted(job: Item | Question) -> SendResult | Asked:
        slot = send_one(job)
        taken.append(job.seq)
        return slot

    runner._senders._send = counted
    results = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()
    try:
        assert held.reached.wait(WAIT_S), "the 429 never reached the committer"
        # Every sender now frees up and takes what was claimed ahead, the committer still
        # holding the 429 unjudged: wait until each queued item has been taken and decided.
        channel.release.set()
        deadline = time.monotonic() + WAIT_S
        while len(taken) < items:
            assert time.monotonic() < deadline, "the senders never took the queued items"
            time.sleep(0.01)
    finally:
        channel.release.set()
        held.go.set()
        thread.join(WAIT_S)
        store.close()
    assert results and results[0].stop is Stop.COMPLETED, results
    early = [
        (item, round(at - channel.throttled_at, 3))
        for item, at in channel.starts
        if channel.throttled_at < at < channel.throttled_at + waits.scaled(1.0)
    ]
    assert early == [], "requests started within Retry-After of the 429"


@dataclass
class _Recording:
    """A downstream that notes which items' requests started and answers each 200 once
    `release` is set (the wire does not matter here: only the order of events)."""

    name: str = "hooks"
    idempotent: bool = True
    queryable: bool = True
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    started: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        with self.lock:
            self.started.append(int(intent.item_id))
        self.release.wait(WAIT_S)
        return Receipt("r-" + intent.item_id, intent.intent_digest)

    def query(self, key: str) -> Receipt | None:
        return None

    def close(self) -> None:
        pass


def _runner(ws: Workspace, items: int, n: int, channel: _Recording) -> tuple[Store, Runner]:
    store = _planned_run(ws, items)
    version = store.leases.acquire_lease("r1", {"host": "h", "pid": os.getpid()}, 30, holder_alive)
    runner = Runner(
        store, store.core.get_run("r1"),
        {"hooks": channel}, RetryPolicy.from_settings(5, 60, 0.01, 0.05),
        RunOptions(concurrency=n), lease_version=version, control=RunControl(),
        say=lambda line: None,
    )  # fmt: skip
    return store, runner


def _released(ws: Workspace, *, attempted: bool = False) -> set[int]:
    """Items whose claim was given back never attempted (their attempt closed not_started,
    the item pending with no attempt counted; with `attempted`, whatever its count)."""
    pending = {i.seq: i.attempts for i in ws.ledger.items() if i.state == "pending"}
    return {
        a.seq
        for a in ws.ledger.attempts()
        if a.outcome == "not_started" and a.seq in pending and (attempted or pending[a.seq] == 0)
    }


@CONCURRENCY
@pytest.mark.timeout(60)
def test_no_item_claimed_after_a_cancel_was_committed_starts(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel committed just before a commit that claims items (at N = 1, and at 8 with 3N
    claimed ahead): the committer reads the run's flags after that commit and the senders
    check what it read, so none of those items starts; each is released never attempted and
    the run ends cancelled with nothing in flight."""
    channel = _Recording()
    channel.release.set()
    store, runner = _runner(ws, 40, n, channel)
    canceller = Store.open(ws.db)
    step = store.ledger.step
    after_cancel: list[int] = []  # the items claimed by the first commit after the cancel

    def cancel_then_step(*args: Any, **kwargs: Any) -> list[Item]:
        claim = args[3] > 0 and channel.started and not after_cancel
        if claim:
            assert canceller.ledger.request_cancel("r1")
        claimed = step(*args, **kwargs)
        if claim:
            after_cancel.extend(item.seq for item in claimed)
        return claimed

    monkeypatch.setattr(store.ledger, "step", cancel_then_step)
    try:
        result = runner.run()
    finally:
        store.close()
        canceller.close()
    assert result.stop is Stop.CANCELLED, result
    assert after_cancel, "no commit claimed items after the cancel"
    assert set(after_cancel).isdisjoint(channel.started)
    assert set(after_cancel) <= _released(ws)
    assert _run_state(ws) == "cancelled"
    _assert_nothing_left_open(ws)


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.timeout(60)
def test_items_claimed_ahead_never_start_once_the_worker_saw_a_cancel(
    ws: Workspace, n: int
) -> None:
    """N requests under way and 3N items claimed ahead, waiting for a sender: once the
    committer has read the cancel (it looks at each turn, at least every 0.2 s), the
    senders that free up start none of the 3N; they are released never attempted."""
    channel = _Recording()
    store, runner = _runner(ws, 5 * n, n, channel)
    canceller = Store.open(ws.db)
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()
    try:
        wait_for(lambda: len(channel.started) == n, "N requests under way")
        assert canceller.ledger.request_cancel("r1")
        wait_for(lambda: runner.control.requested(Stop.CANCELLED), "the committer read the cancel")
        channel.release.set()
        thread.join(WAIT_S)
    finally:
        channel.release.set()
        thread.join(WAIT_S)
        store.close()
        canceller.close()
    assert results and results[0].stop is Stop.CANCELLED, results
    assert len(channel.started) == n
    assert len(_released(ws)) == 3 * n
    assert _run_state(ws) == "cancelled"
    _assert_nothing_left_open(ws)


@pytest.mark.timeout(60)
def test_cancel_reports_the_items_it_released_as_never_attempted(ws: Workspace) -> None:
    """`notifier cancel --report --format json` while 8 requests are under way and 24 items
    are claimed ahead: the worker releases those 24 unstarted, and the report counts each
    with 0 attempts, never attempted, not as a retry that may have been delivered."""
    n = 8
    channel = _Recording()
    store, runner = _runner(ws, 5 * n, n, channel)
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()

    def release_once_the_worker_read_the_cancel() -> None:
        try:
            wait_for(lambda: runner.control.requested(Stop.CANCELLED), "the worker read the cancel")
        finally:
            channel.release.set()

    try:
        wait_for(lambda: len(channel.started) == n, "N requests under way")
        # The command in-process, the worker's senders released once it has seen the cancel.
        with meanwhile(release_once_the_worker_read_the_cancel):
            cancel = ws.invoke("cancel", "r1", "--report", "--format", "json", "--wait", "30")
        thread.join(WAIT_S)
    finally:
        channel.release.set()
        thread.join(WAIT_S)
        store.close()
    assert results and results[0].stop is Stop.CANCELLED, results
    report = json.loads(cancel.stdout)
    assert report["state"] == "cancelled", report
    released = _released(ws, attempted=True)
    assert len(released) == 3 * n
    rows = {row["seq"]: row for row in report["items"]}
    assert {(rows[seq]["attempts"], rows[seq]["pending_kind"]) for seq in released} == {
        (0, "never_attempted")
    }, cancel.output
    assert report["pending_detail"]["never_attempted"] == report["counts"]["pending"]
    assert report["pending_detail"]["maybe_delivered"] == 0


@CONCURRENCY
def test_an_approval_that_expires_mid_run_pauses_it_until_approved_again(
    ws: Workspace, n: int
) -> None:
    """No request starts after the approval's expiry: the N requests under way when it
    expires finish, the run pauses (exit 4) saying how to renew it, a resume is refused
    until `notifier approve` renews it, then it completes, each key committed once."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True, timeout=30)
        )
        planned = _send(ws, 40, n, "--require-approval")
        assert planned.exit_code == 0, planned.output
        fingerprint = ws.ledger.run().fingerprint
        assert fingerprint is not None
        approved = ws.invoke("approve", "--fingerprint", fingerprint, "--expires-in", "6s")
        assert approved.exit_code == 0, approved.output
        raw: Any = ws.ledger.run().approval
        expires_at = clock.parse((raw if isinstance(raw, dict) else json.loads(raw))["expires_at"])

        def answer_after_the_expiry() -> None:
            # N requests started before the expiry; the receiver answers them only after it.
            try:
                receiver.wait_for(lambda r: len(r.arrivals) >= n)
                wait_for(lambda: clock.now() > expires_at, "the approval expired")
            finally:
                hold.set()

        with meanwhile(answer_after_the_expiry):
            resumed = ws.invoke("resume", "--concurrency", str(n))
        out = resumed.output
        assert resumed.exit_code == 4, out
        assert "notifier approve" in out, out
        assert _run_state(ws) == "paused"
        _assert_nothing_left_open(ws)
        assert [a for a in receiver.arrivals if a.wall > expires_at.timestamp()] == []
        assert len(receiver.arrivals) == n
        refused = ws.invoke("resume")
        assert refused.exit_code == 4, refused.output
        renewed = ws.invoke("approve", "--fingerprint", fingerprint, "--expires-in", "1h")
        assert renewed.exit_code == 0, renewed.output
        finished = ws.invoke("resume", "--concurrency", str(n))
        assert finished.exit_code == 0, finished.output
        assert receiver.commits == dict.fromkeys(_keys(ws), 1)


@CONCURRENCY
def test_a_rate_slower_than_max_wait_pauses_the_run_instead_of_waiting(
    ws: Workspace, n: int
) -> None:
    """`--rate 0.001 --max-wait 5`: the first send goes, the next would be 1000 s away, so
    the run pauses at once until then (exit 3, paused_until stored) instead of sleeping
    for hours; nothing is left in flight."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        result = _send(ws, 5, n, "--rate", "0.001", "--max-wait", "5")
        assert result.exit_code == 3, result.output
        assert "--rate" in result.output, result.output
        assert _run_state(ws) == "paused"
        _assert_nothing_left_open(ws)
        assert len(receiver.arrivals) == 1
        until = ws.ledger.run().paused_until
        assert (clock.parse(str(until)) - clock.now()).total_seconds() > 900


@pytest.mark.timeout(90)
def test_five_unknowns_in_a_row_stop_the_senders_before_the_committer_has_judged_them(
    ws: Workspace,
) -> None:
    """At N = 8 with 3N claimed ahead on a channel that cannot dedupe, whose sends and
    status queries all answer 500: once five answers in a row are uncertain no sender
    starts another request, though judging them (their queries, retried) takes seconds:
    far fewer than 2N requests leave, not every item claimed ahead."""
    receiver = Receiver(answer=lambda item, _n: 500, query_status=500)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True)
        )
        result = _send(ws, 40, 8)
    assert result.exit_code == 3, result.output
    assert _run_state(ws) == "halted"
    # N first requests, then at most limit - 1 more: the senders that saw the first four
    # uncertain answers may each start one before the fifth arrives.
    assert len(receiver.arrivals) <= 8 + 4, f"{len(receiver.arrivals)} requests left"


@pytest.mark.parametrize(
    ("reason", "cause", "stop", "exit_code"),
    [
        (
            APPROVAL_PAUSE + " expired at 2026-01-01 10:00:00 UTC",
            StopCause.APPROVAL_EXPIRED,
            Stop.APPROVAL_EXPIRED,
            4,
        ),
        (
            f"channel 'hooks'{CHANNEL_DOWN_PAUSE}5 requests in a row",
            StopCause.CHANNEL_DOWN,
            Stop.CHANNEL_DOWN,
            3,
        ),
        ("1 item(s) with unknown outcome", StopCause.UNKNOWN_LEFT, Stop.UNKNOWN_LEFT, 3),
        # The cause decides, never the wording: a reason that reads like another stop's.
        (
            "interrupted: channel 'x' is down: its approval",
            StopCause.UNKNOWN_LEFT,
            Stop.UNKNOWN_LEFT,
            3,
        ),
    ],
    ids=["approval", "channel-down", "unknown", "cause-not-prose"],
)
def test_a_worker_that_finds_the_run_paused_by_another_ends_as_that_pause_says(
    tmp_path: Path, reason: str, cause: StopCause, stop: Stop, exit_code: int
) -> None:
    """A worker of a shared run that finds it paused by another worker reports that
    pause's own ending, by the cause stored with it: an expired approval exits 4 (not 3
    with advice about unknowns), a channel that is down exits 3 saying resume goes on once
    it answers."""
    store = Store.open(tmp_path / "receipts.db", create=True)
    try:
        store.plans.create_run(
            {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(),
             "batch_path": "b", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
             "channel_snapshot": {}, "options": {}, "contract_version": "v1"},
            [],
        )  # fmt: skip
        version = store.leases.acquire_lease(
            "r1", {"host": "h", "pid": os.getpid()}, 60, holder_alive
        )
        store.ledger.move_run("r1", RunTrigger.START, version)
        store.ledger.move_run(
            "r1", RunTrigger.PAUSE, version, stop_reason=reason, stop_cause=cause
        )  # the other worker
        runner = Runner(
            store, store.core.get_run("r1"),
            {}, RetryPolicy(), RunOptions(), lease_version=version,
            control=RunControl(), say=lambda line: None,
        )  # fmt: skip
        result = runner.coord.moved_by_another(RunState.PAUSED)
    finally:
        store.close()
    assert (result.stop, int(run_exit(result))) == (stop, exit_code)
    if stop is not Stop.UNKNOWN_LEFT:
        assert "reconcile --manual" not in run_advice(result, "r1", "notifier send b.csv")
