"""A 404 from a status query proves "not sent" only once `timeout + query_delay` has passed
since the request LEFT, whatever ended the attempt: a gateway's 504 at once, or a reset at
once, ends it early while the receiver behind may still commit the request. Through the real
CLI against tests/receiver.py on 127.0.0.1 answering early and committing 1.2 s after each
request arrived (timeout 2, query_delay 0.5: within the window), at N = 1 and N = 8 (a
`status_url` webhook claims items ahead), on both stores, live and after a kill -9."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from notifier.domain import clock
from notifier.store import Store

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import Receiver, receiving, webhook_config
from ..support.background import meanwhile, send_in_background
from ..support.crashed import crash_send
from ..support.waits import past_every_window

pytestmark = pytest.mark.both_stores

TIMEOUT_S = 2
QUERY_DELAY_S = 0.5
COMMIT_AFTER_S = 1.2  # after the early answer and the first queries: within the window
EARLY = pytest.mark.parametrize("early", ["504", "reset"])
CONCURRENCY = pytest.mark.parametrize("n", [1, 8])


def _configure(ws: Workspace, receiver: Receiver, retry: str | None = None) -> None:
    extra = {} if retry is None else {"retry": retry}
    (ws.path / "notifier.toml").write_text(
        webhook_config(
            receiver,
            idempotent=False,
            status=True,
            timeout=TIMEOUT_S,
            query_delay=QUERY_DELAY_S,
            **extra,
        )
    )


def _rows(n: int) -> int:
    return 2 if n == 1 else 2 * n  # at N = 8, more than the senders: some claimed ahead


def _killed_after_the_first_answer(ws: Workspace, receiver: Receiver, rows: int, n: int) -> None:
    """`send` of `rows` rows at --concurrency `n`, killed (137) right after the first answer
    was recorded: at N = 8 others are in flight or claimed ahead."""
    _configure(ws, receiver)
    ws.write_csv("batch.csv", make_rows(rows))
    crash_send("after-receipt:1", db=ws.db, channel="hooks", concurrency=n)


def _assert_each_delivered_once(ws: Workspace, receiver: Receiver, rows: int) -> None:
    """Every request that arrived has been committed (a second one, had there been one,
    too), and each item exactly once, under its one key, posted once."""
    receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
    keys = [item.idempotency_key for item in ws.ledger.items()]
    assert len(keys) == rows
    assert receiver.commits == dict.fromkeys(keys, 1)
    assert sorted(receiver.deliveries().values()) == [1] * rows
    assert len(receiver.arrivals) == rows


def _settled_and_finished(ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every window has closed, those the commands before opened included (an attempt
    a killed process left open is judged from when its holder was found gone: a window the
    first command's look opened): `reconcile` asks about what is still unknown, and a
    `resume` sends what it proved never delivered."""
    past_every_window(monkeypatch)
    if "unknown" in ws.ledger.state_counts():
        settled = ws.invoke("reconcile")
        assert settled.exit_code in (0, 3), settled.output
    if "pending" in ws.ledger.state_counts():
        finished = ws.invoke("resume", "--concurrency", str(n))
        assert finished.exit_code == 0, finished.output


def _assert_all_sent(ws: Workspace, rows: int) -> None:
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == rows, report["counts"]
    assert set(ws.ledger.states().values()) == {"sent"}


@EARLY
@CONCURRENCY
@pytest.mark.timeout(60)
def test_an_early_answer_and_a_late_commit_is_delivered_once_and_reported_sent(
    ws: Workspace, early: str, n: int
) -> None:
    """The query right after the early answer finds nothing (404), and so does one
    `query_delay` after the answer; the item waits until `timeout + query_delay` after its
    request left, is found then, and is never sent again."""
    receiver = Receiver(early=early, commit_after_s=COMMIT_AFTER_S)
    rows = _rows(n)
    with receiving(receiver):
        _configure(ws, receiver)
        ws.write_csv("batch.csv", make_rows(rows))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        _assert_each_delivered_once(ws, receiver, rows)
    assert sent.exit_code == 0, sent.output
    _assert_all_sent(ws, rows)
    assert set(ws.ledger.receipt_sources().values()) == {"query"}


@EARLY
@CONCURRENCY
@pytest.mark.timeout(90)
def test_a_cancel_after_a_kill_never_reports_a_held_item_as_never_delivered(
    ws: Workspace, early: str, n: int
) -> None:
    """Killed right after the first early answer was recorded, then cancelled: `cancel`
    takes no 404 inside an item's window as proof, so every item the receiver holds (or
    will hold) ends `sent` or `unknown`, never `pending` (not delivered) in the cancelled
    run."""
    receiver = Receiver(early=early, commit_after_s=COMMIT_AFTER_S)
    rows = _rows(n)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, rows, n)
        cancelled = ws.invoke("cancel", "--report", "--format", "json")
        receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
        held = {a.item_id for a in receiver.arrivals}
    assert cancelled.exit_code in (0, 3), cancelled.output
    report = json.loads(cancelled.stdout)
    assert report["state"] == "cancelled"
    ends = {row["id"]: row["state"] for row in report["items"] if row["id"] in held}
    assert set(ends.values()) <= {"sent", "unknown"}, ends
    assert len(ends) == len(held)


@EARLY
@CONCURRENCY
@pytest.mark.timeout(90)
def test_a_resume_after_a_kill_waits_the_window_from_when_the_request_left(
    ws: Workspace, early: str, n: int
) -> None:
    """Killed right after the first early answer was recorded (its item unknown, waiting
    for its query window; at N = 8 others in flight or claimed ahead): `resume` counts a
    404 only from the request's start plus `timeout + query_delay`, so the late commit is
    found, not sent a second time."""
    receiver = Receiver(early=early, commit_after_s=COMMIT_AFTER_S)
    rows = _rows(n)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, rows, n)
        resumed = ws.invoke("resume", "--concurrency", str(n))
        _assert_each_delivered_once(ws, receiver, rows)
    assert resumed.exit_code == 0, resumed.output
    _assert_all_sent(ws, rows)


@CONCURRENCY
@pytest.mark.timeout(60)
def test_with_one_attempt_an_early_404_never_fails_an_item_the_receiver_holds(
    ws: Workspace, n: int
) -> None:
    """`max_attempts = 1`: a 404 inside the window does not make the item failed (never
    delivered); it is found once the window has passed. Sending the file again then plans
    nothing that was delivered: each recipient still has one copy."""
    receiver = Receiver(early="504", commit_after_s=COMMIT_AFTER_S)
    rows = _rows(n)
    with receiving(receiver):
        _configure(ws, receiver, retry="[retry]\nmax_attempts = 1\n")
        ws.write_csv("batch.csv", make_rows(rows))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
        assert "failed" not in ws.ledger.state_counts()
        again = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
        assert sorted(receiver.deliveries().values()) == [1] * rows
    assert sent.exit_code == 0, sent.output
    assert again.exit_code == 0, again.output
    _assert_all_sent(ws, rows)


@CONCURRENCY
@pytest.mark.timeout(90)
def test_a_cancel_after_a_kill_waits_out_the_window_and_asks_again(ws: Workspace, n: int) -> None:
    """Killed with requests at the receiver (committed late) and, at N = 8, items claimed
    ahead that usually never left: `cancel` waits out each item's window (within --wait) and
    asks again, so every delivered item ends `sent`, every never-left one never delivered
    (`pending`), none `unknown`, and nobody is sent to a manual decision."""
    receiver = Receiver(early="504", commit_after_s=COMMIT_AFTER_S)
    rows = _rows(n)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, rows, n)
        cancelled = ws.invoke("cancel", "--report", "--format", "json", "--wait", "30")
        held = {a.item_id for a in receiver.arrivals}
    assert cancelled.exit_code == _cancelled_exit(held, rows), cancelled.output
    assert "--manual" not in cancelled.stderr, cancelled.stderr
    assert "will send again" not in cancelled.stderr, cancelled.stderr  # the run sends no more
    report = json.loads(cancelled.stdout)
    ends = {row["id"]: row["state"] for row in report["items"]}
    assert report["counts"]["unknown"] == 0, ends
    assert {ends[i] for i in held} == {"sent"}
    assert {s for i, s in ends.items() if i not in held} <= {"pending"}
    assert receiver.commits == dict.fromkeys(receiver.commits, 1)


def test_a_cancel_whose_wait_ends_first_says_when_reconcile_settles_them(
    ws: Workspace,
) -> None:
    """With --wait 0, `cancel` cannot wait out the receiver's window: the items it leaves
    unknown are named with the moment a plain `notifier reconcile` settles them by query,
    not sent to `--manual`; that reconcile, run then, settles them and says that the
    cancelled run will not send them. (The receiver commits only once cancel has ended: a
    condition, not a time.)"""
    committed = threading.Event()
    receiver = Receiver(early="504", commit_hold=committed)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, 2, 1)
        cancelled = ws.invoke("cancel", "--wait", "0")
        committed.set()  # within the window, which cancel could not wait out
        said = cancelled.output
        assert cancelled.exit_code == 3, said
        run_id = ws.ledger.run().run_id
        assert f"a plain `notifier reconcile {run_id}` then settles them by query" in said
        assert "--manual" not in said
        assert ws.ledger.item("u1").state == "unknown"
        receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
        wait_for(lambda: _window_passed(ws), "every unknown item's window passed", timeout=30)
        settled = ws.invoke("reconcile", run_id)
    assert settled.exit_code in (0, 3), settled.output
    assert ws.ledger.item("u1").state == "sent"
    assert "will send again" not in settled.output


def _cancelled_exit(held: set[str], rows: int) -> int:
    """The exit of a command that leaves a run cancelled and settled: 3 with items never sent,
    0 when every item had left before the kill (a slow committer lets the senders send
    everything before the first answer is recorded)."""
    return 3 if len(held) < rows else 0


def _window_passed(ws: Workspace) -> bool:
    """Whether every unknown item's asking-again time has passed."""
    times = ws.ledger.next_attempts("unknown").values()
    return all(t is None or t <= clock.now_iso() for t in times)


@CONCURRENCY
@pytest.mark.timeout(90)
def test_a_resume_closing_a_cancelled_run_sends_no_one_to_a_manual_mark_inside_a_window(
    ws: Workspace, n: int
) -> None:
    """Killed right after the first early answer was recorded, with a cancel asked for
    meanwhile (its flag set, the run not closed): `resume` closes the run cancelled. An item
    whose 404 proves nothing yet (the receiver may still commit it) stays unknown, and the
    advice printed for it is a plain `reconcile` once its window has passed, never a manual
    mark (marked not sent, it would go out again to a recipient who got it). Following that
    advice settles it by query: every item the receiver took delivered once and `sent`.
    (Where the receiver has committed before `resume` asks, nothing is left to advise; the
    wording itself: tests/unit/test_advice_for_unknown_items.py.)"""
    receiver = Receiver(early="504", commit_after_s=COMMIT_AFTER_S)
    rows = _rows(n)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, rows, n)
        run_id = ws.ledger.run().run_id
        store = Store.open(ws.db)
        try:
            assert store.ledger.request_cancel(run_id)
        finally:
            store.close()
        resumed = ws.invoke("resume")
        assert ws.ledger.run().state == "cancelled", resumed.output
        assert "reconcile --manual" not in resumed.output, resumed.output
        left_unknown = "unknown" in ws.ledger.state_counts()
        if left_unknown:
            assert f"a plain `notifier reconcile {run_id}` then" in resumed.output
        receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
        held = {a.item_id for a in receiver.arrivals}  # final: every arrival is committed
        if left_unknown:  # the advice followed, once the moment it names has passed
            wait_for(lambda: _window_passed(ws), "every unknown item's window passed", timeout=30)
            reconciled = ws.invoke("reconcile", run_id)
            assert reconciled.exit_code == _cancelled_exit(held, rows), reconciled.output
    assert "unknown" not in ws.ledger.state_counts()
    assert {ws.ledger.item(i).state for i in held} == {"sent"}
    assert sorted(receiver.deliveries().values()) == [1] * len(held)


def _looked_up_then_committed(
    receiver: Receiver,
    took: set[str],
    commit: threading.Event,
    answer: threading.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[], None]:
    """The receiver's side, from now on: once a key it took is looked up (nothing there
    yet), it commits the held requests, inside their window; once they are committed, this
    process's clock moves past every window; only then is the held answer let go."""
    asked_before = len(receiver.queried)

    def receiver_side() -> None:
        try:
            receiver.wait_for(lambda r: bool(took.intersection(r.queried[asked_before:])))
            commit.set()
            receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
            past_every_window(monkeypatch)
        finally:
            answer.set()

    return receiver_side


@CONCURRENCY
@pytest.mark.timeout(90)
def test_a_404_looked_up_inside_the_window_proves_nothing_however_late_it_comes_back(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed right after the first early answer was recorded. `resume` asks about an item
    whose request the receiver took: the receiver looks the key up while the window is open
    (nothing there yet), then commits the request, and its 404 comes back only after every
    window closed. What counts is when the receiver looked, not when the answer came: the
    item is not sent again, and is found later. (The answer is held while this process's
    wall clock is moved past every window: conditions, no waits.)"""
    commit = threading.Event()
    answer = threading.Event()
    answer.set()  # the senders' own queries, before the kill, are answered at once
    receiver = Receiver(early="504", commit_hold=commit, query_hold=answer)
    rows = _rows(n)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, rows, n)
        took = {arrival.key for arrival in receiver.arrivals}
        answer.clear()
        with meanwhile(_looked_up_then_committed(receiver, took, commit, answer, monkeypatch)):
            resumed = ws.invoke("resume", "--concurrency", str(n))
        assert resumed.exit_code in (0, 3), resumed.output
        assert "not found yet" in resumed.output, resumed.output  # a 404 judged, as held
        _settled_and_finished(ws, n, monkeypatch)
        _assert_each_delivered_once(ws, receiver, rows)
    _assert_all_sent(ws, rows)


@CONCURRENCY
@pytest.mark.parametrize("then", ["reconcile", "cancel"])
@pytest.mark.timeout(90)
def test_a_404_that_reconcile_or_cancel_got_for_a_look_inside_the_window_proves_nothing(
    ws: Workspace, n: int, then: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, through the operator's commands, which ask about one item at a time:
    killed right after the first early answer was recorded, then `reconcile` or `cancel`
    asks about an item whose request the receiver took. The receiver looks the key up inside
    the window (nothing there yet), then commits, and its 404 comes back only after every
    window closed. Neither command takes it as proof: the item is not reported undelivered,
    never sent again, and is found sent when asked again. (Only the queries of the keys the
    receiver took are held: the commands ask in the order of the items.)"""
    commit = threading.Event()
    answer = threading.Event()
    answer.set()
    receiver = Receiver(early="504", commit_hold=commit, query_hold=answer)
    rows = _rows(n)
    with receiving(receiver):
        _killed_after_the_first_answer(ws, receiver, rows, n)
        took = {arrival.key for arrival in receiver.arrivals}
        receiver.query_hold_keys = took
        answer.clear()
        with meanwhile(_looked_up_then_committed(receiver, took, commit, answer, monkeypatch)):
            asked = ws.invoke(then, *(["--wait", "30"] if then == "cancel" else []))
        assert asked.exit_code in (0, 3), asked.output
        assert "not found yet" in asked.output, asked.output  # a 404 judged, as held
        states = {item.idempotency_key: item.state for item in ws.ledger.items()}
        if then == "cancel":  # asked again once the window had passed (this clock's)
            assert {states[key] for key in took} == {"sent"}, states
            receiver.wait_for(lambda r: sum(r.commits.values()) >= len(r.arrivals))
            assert receiver.commits == dict.fromkeys(took, 1)
            assert len(receiver.arrivals) == len(took)  # none sent again
            return
        assert {states[key] for key in took} <= {"sent", "unknown"}, states
        _settled_and_finished(ws, n, monkeypatch)
        _assert_each_delivered_once(ws, receiver, rows)
    _assert_all_sent(ws, rows)


@CONCURRENCY
@pytest.mark.timeout(90)
def test_a_worker_closing_a_cancel_asks_about_the_unknown_items_a_query_now_settles(
    ws: Workspace, n: int, fast_waits: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At N = 1 and 8: u1's answer is lost (a 504 for a request the receiver took) while the
    receiver's status endpoint fails, so u1 is left unknown; u2, held in flight, keeps the
    worker sending. The status endpoint recovers, u1's window passes, and the run is
    cancelled: the worker asks about u1 before it closes the run (its revisits stopped with
    the cancel) and finds it sent, so no item a query settles is advised to a manual mark.
    (The window passes on this process's clock, moved on: no wait.)"""
    hold = threading.Event()
    receiver = Receiver(answer=lambda item_id, nth: 504 if item_id == "u1" else None,
                        commit_first=True, hold=hold, query_status=500)  # fmt: skip
    with receiving(receiver):
        try:
            _configure(ws, receiver)
            ws.write_csv("batch.csv", make_rows(2))
            worker = send_in_background(ws, "hooks", n)
            wait_for(lambda: ws.has_database() and ws.ledger.states().get("u1") == "unknown",
                     "u1 left unknown, its queries failed")  # fmt: skip
            receiver.query_status = None  # the status endpoint answers again
            past_every_window(monkeypatch)

            def release_once_cancelled() -> None:
                try:
                    wait_for(lambda: ws.ledger.run().cancel_requested_at is not None, "cancel")
                finally:
                    hold.set()  # u2 answered: the worker sees the cancel and closes the run

            with meanwhile(release_once_cancelled):
                cancelled = ws.invoke("cancel", "--wait", "60")
        finally:
            hold.set()
        assert worker.exit_code(60) == 0  # pending were never attempted: cancelled, exit 0
    assert cancelled.exit_code in (0, 3), cancelled.output
    assert "--manual" not in cancelled.output, cancelled.output
    assert ws.ledger.states() == {"u1": "sent", "u2": "sent"}
    assert receiver.commits == {item.idempotency_key: 1 for item in ws.ledger.items()}


@CONCURRENCY
@pytest.mark.timeout(60)
def test_a_cancel_that_proves_an_item_undelivered_says_its_run_will_not_send_it(
    ws: Workspace, n: int
) -> None:
    """Killed after item 1 was claimed, its request never sent (at N = 8 with others claimed
    beside it): `cancel` waits out the window, finds nothing, and leaves it never delivered
    (pending in the cancelled run). What it says is that the run will not send it (sending
    the file again will), never that it will be sent again."""
    receiver = Receiver(early="504", commit_after_s=COMMIT_AFTER_S)
    with receiving(receiver):
        _configure(ws, receiver)
        ws.write_csv("batch.csv", make_rows(_rows(n)))
        crash_send("after-intent:1", db=ws.db, channel="hooks", concurrency=n)
        cancelled = ws.invoke("cancel", "--wait", "30")
    assert "u1" not in {arrival.item_id for arrival in receiver.arrivals}
    assert cancelled.exit_code in (0, 3), cancelled.output
    assert "nothing was delivered; its run is finished or being cancelled" in cancelled.output
    assert "will send again" not in cancelled.output, cancelled.output
    assert ws.ledger.item("u1").state == "pending"
