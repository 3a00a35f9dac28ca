"""The run control (notifier/engine/run_control.py), on its own: the one holder of a working
process's stop state. Whatever asks the run to stop, the strongest cause decides how it ends
and the first of equal strength stands; each cause stops sends and status queries as it
should; a signal, a lost lease and the approval's expiry each reach it; and a request from
any thread wakes every waiter at once, however many threads request together."""

from __future__ import annotations

import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from notifier.domain.records import Item
from notifier.domain.state_machine import ItemState, RunState
from notifier.engine.run_control import RunControl, Stop
from notifier.store import LeaseLost, LossCause

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
WAIT_S = 10.0

# Every cause a process may be asked to stop for, as its requester asks it.
REQUESTED = [
    Stop.LEASE_LOST,
    Stop.CONFLICT,
    Stop.HALTED,
    Stop.CHANNEL_DOWN,
    Stop.MOVED,
    Stop.CANCELLED,
    Stop.RATE_LIMITED,
]


# Why a send does not start, by the cause in force (the attempt's reason, the logs).
HELD_BACK = {
    Stop.LEASE_LOST: "this worker can no longer prove the run is its own",
    Stop.CONFLICT: "the run is halting (why) before it started",
    Stop.HALTED: "the run is halting (why) before it started",
    Stop.CHANNEL_DOWN: "the run is halting (why) before it started",
    Stop.MOVED: "the run was halted by another worker before it started",
    Stop.CANCELLED: "cancel requested at why",
    Stop.RATE_LIMITED: None,
}


def _request(control: RunControl, cause: Stop, detail: str = "why") -> None:
    if cause is Stop.LEASE_LOST:
        control.lose(LossCause.TAKEN_OVER)
    elif cause is Stop.MOVED:
        control.request(cause, "halted", moved_to=RunState.HALTED)
    elif cause is Stop.RATE_LIMITED:
        control.request(cause, detail, until=time.monotonic() + 60)
    else:
        control.request(cause, detail)


def _item(not_after: str | None = None) -> Item:
    return Item(
        "r1", 1, "1", "hooks", "a@x.y", {}, "k1", "sha256:1", ItemState.IN_FLIGHT, 1,
        None, None, None, not_after=not_after,
    )  # fmt: skip


def test_nothing_requested_lets_everything_start() -> None:
    control = RunControl()
    assert control.may_start(_item(), NOW) is None
    assert control.may_ask(NOW)
    assert not control.stopping(NOW)
    assert control.ending(NOW) is None
    assert not control.wait(0.01)


def test_the_first_cause_of_equal_strength_stands() -> None:
    """A halt by the unknown streak, then a channel down (as strong): the run halts for the
    first; and a cause asked again keeps its first detail."""
    control = RunControl()
    control.request(Stop.HALTED, "5 unknown outcomes in a row")
    control.request(Stop.CHANNEL_DOWN, "channel 'hooks' is down")
    control.request(Stop.HALTED, "a later halt")
    ending = control.ending(NOW)
    assert ending is not None
    assert (ending.cause, ending.detail) == (Stop.HALTED, "5 unknown outcomes in a row")


@pytest.mark.parametrize(
    ("first", "then", "wins"),
    [
        (Stop.CANCELLED, Stop.CONFLICT, Stop.CONFLICT),  # a safety halt over a cancel
        (Stop.RATE_LIMITED, Stop.CANCELLED, Stop.CANCELLED),  # a cancel during a rate pause
        (Stop.CANCELLED, Stop.MOVED, Stop.MOVED),  # read together: the move first
        (Stop.HALTED, Stop.CONFLICT, Stop.CONFLICT),  # a conflict names what is wrong
        (Stop.CONFLICT, Stop.LEASE_LOST, Stop.LEASE_LOST),  # nothing more can be recorded
        (Stop.CONFLICT, Stop.RATE_LIMITED, Stop.CONFLICT),
    ],
)
def test_the_strongest_cause_decides_the_ending_whatever_came_first(
    first: Stop, then: Stop, wins: Stop
) -> None:
    control = RunControl()
    _request(control, first)
    _request(control, then)
    ending = control.ending(NOW)
    assert ending is not None and ending.cause is wins, ending


def test_a_signal_outranks_a_cancel_and_yields_to_a_halt() -> None:
    control = RunControl()
    control.request(Stop.CANCELLED, "2026-01-01T12:00:00Z")
    assert control.interrupt(signal.SIGTERM)
    ending = control.ending(NOW)
    assert ending is not None and (ending.cause, ending.detail) == (Stop.TERMINATED, "SIGTERM")
    control.request(Stop.HALTED, "endpoint gone (item 3)")
    ending = control.ending(NOW)
    assert ending is not None and ending.cause is Stop.HALTED


def test_the_second_signal_is_told_apart_and_the_first_one_stands() -> None:
    """The handler leaves at once on the second signal (signals.interrupt_guard), with the
    exit status of the first."""
    control = RunControl()
    assert control.interrupt(signal.SIGINT)
    assert not control.interrupt(signal.SIGTERM)
    assert control.first_signal is signal.SIGINT and control.signal_name == "Ctrl-C"
    ending = control.ending(NOW)
    assert ending is not None and ending.cause is Stop.INTERRUPTED


def test_a_senders_early_reading_of_a_halt_gives_way_to_the_committers_judgement() -> None:
    """A sender's provisional halt stops sends at once, but the ending is the committer's
    judgement of the answer; before it, an operator's cancel outranks the reading."""
    control = RunControl()
    control.request(Stop.HALTED, "gone answer for item 3", provisional=True)
    assert (
        control.may_start(None, NOW)
        == "the run is halting (gone answer for item 3) before it started"
    )
    control.request(Stop.CANCELLED, "2026-01-01T12:00:00Z")
    ending = control.ending(NOW)
    assert ending is not None and ending.cause is Stop.CANCELLED
    control.request(Stop.HALTED, "endpoint gone (item 3): 410")
    control.request(Stop.HALTED, "the worker is stopping", provisional=True)
    ending = control.ending(NOW)
    assert ending is not None
    assert (ending.cause, ending.detail) == (Stop.HALTED, "endpoint gone (item 3): 410")


@pytest.mark.parametrize("cause", REQUESTED)
def test_each_cause_stops_queries_and_every_one_but_a_rate_pause_stops_sends(cause: Stop) -> None:
    """A --rate pause lets the items already claimed of other channels go out (the committer
    claims nothing new); every other cause holds every send not yet started. No cause lets
    a status query start: each may take three timeouts while the stop waits."""
    control = RunControl()
    _request(control, cause)
    assert control.may_start(_item(), NOW) == HELD_BACK[cause]
    assert not control.may_ask(NOW)
    assert control.stopping(NOW)
    assert control.requested(cause)


def test_a_signal_stops_sends_and_queries() -> None:
    control = RunControl()
    control.interrupt(signal.SIGINT)
    assert control.may_start(_item(), NOW) == "interrupted (Ctrl-C) before it started"
    assert not control.may_ask(NOW)


def test_a_rate_pause_does_not_hide_a_weaker_cause_that_stops_sends() -> None:
    """The approval expired during a --rate pause (which outranks it for the ending): sends
    stop all the same."""
    control = RunControl()
    control.request(Stop.RATE_LIMITED, "the channel's --rate", until=time.monotonic() + 60)
    control.expires_at(NOW, "its approval expired at noon")
    assert control.may_start(None, NOW) == "the run's approval expired before it started"
    ending = control.ending(NOW)
    assert ending is not None and ending.cause is Stop.RATE_LIMITED


def test_the_approval_stops_sends_from_its_expiry_until_it_is_renewed() -> None:
    control = RunControl()
    control.expires_at(NOW, "its approval expired at noon")
    before = NOW - timedelta(seconds=1)
    assert control.may_start(None, before) is None and control.may_ask(before)
    assert control.may_start(None, NOW) == "the run's approval expired before it started"
    assert not control.may_ask(NOW)
    ending = control.ending(NOW)
    assert ending is not None
    assert (ending.cause, ending.detail) == (Stop.APPROVAL_EXPIRED, "its approval expired at noon")
    control.expires_at(NOW + timedelta(hours=1), "its approval expired at one")  # renewed
    assert control.may_start(None, NOW) is None and control.ending(NOW) is None


def test_an_item_past_its_not_after_does_not_start() -> None:
    control = RunControl()
    late = _item(not_after="2026-01-01T11:00:00Z")
    assert control.may_start(late, NOW) == "not_after 2026-01-01T11:00:00Z passed before it started"
    assert control.may_start(_item(not_after="2026-01-01T13:00:00Z"), NOW) is None
    assert control.may_ask(NOW)  # an item's deadline is no stop of the run


def test_the_first_lease_loss_stands_and_a_stale_lease_says_whether_renewals_failed() -> None:
    control = RunControl()
    control.renewed(ok=False)
    control.lose_stale()
    control.lose(LossCause.TAKEN_OVER)
    assert control.lost and control.loss is LossCause.UNKEPT
    error = control.lost_error("r1", ", so item(s) 3 were not sent")
    assert error.cause is LossCause.UNKEPT and str(error).startswith("run r1: ")
    fresh = RunControl()
    fresh.renewed(ok=True)
    fresh.lose_stale()
    assert fresh.loss is LossCause.STALE


def test_a_loss_found_inside_marking_is_recorded_before_it_leaves() -> None:
    control = RunControl()
    with pytest.raises(LeaseLost), control.marking():
        raise LeaseLost("run r1: taken over", LossCause.TAKEN_OVER)
    assert control.lost and control.loss is LossCause.TAKEN_OVER
    assert control.may_start(None, NOW) == "this worker can no longer prove the run is its own"


@pytest.mark.timeout(30)
def test_a_request_from_another_thread_wakes_every_waiter_at_once() -> None:
    control = RunControl()
    woke: list[float] = []
    lock = threading.Lock()

    def waiter() -> None:
        if control.wait(WAIT_S):
            with lock:
                woke.append(time.monotonic())

    threads = [threading.Thread(target=waiter) for _ in range(8)]
    for thread in threads:
        thread.start()
    asked = time.monotonic()
    control.request(Stop.CANCELLED, "2026-01-01T12:00:00Z")
    for thread in threads:
        thread.join(WAIT_S)
    assert len(woke) == 8, woke
    assert max(woke) - asked < WAIT_S / 2  # woken by the request, not by their timeout


@pytest.mark.timeout(30)
def test_a_signal_wakes_every_waiter_and_takes_no_lock_the_main_thread_may_hold() -> None:
    """The handler runs between two bytecodes of the main thread, which may be inside a
    wait holding the stop event's own lock, or inside a request holding the control's:
    asked then, it returns at once (taking either would hang here until the timeout), and
    the waiters on other threads see it within moments."""
    control = RunControl()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(control.wait(WAIT_S)))
    waiter.start()
    # The event's own lock, private to threading.Event, as its wait holds it.
    held = control._stopped._cond  # type: ignore[attr-defined]
    with control._lock, held:  # as the main thread may hold them
        assert control.interrupt(signal.SIGINT)
    asked = time.monotonic()
    waiter.join(WAIT_S)
    assert woke == [True] and time.monotonic() - asked < WAIT_S / 2
    assert control.wait(0) and control.stopping(NOW)


@pytest.mark.timeout(30)
def test_requests_racing_from_many_threads_keep_one_first_detail_per_cause() -> None:
    """16 threads ask at once, half a cancel and half a halt, each with its own detail: the
    halt ends the run, and each cause keeps exactly one of the details asked (never a mix,
    never lost)."""
    control = RunControl()
    start = threading.Barrier(16)

    def asker(n: int) -> None:
        start.wait(WAIT_S)
        cause = Stop.HALTED if n % 2 else Stop.CANCELLED
        for k in range(200):
            control.request(cause, f"{cause.value} {n}.{k}")

    threads = [threading.Thread(target=asker, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    ending = control.ending(NOW)
    assert ending is not None and ending.cause is Stop.HALTED
    assert ending.detail.startswith("halted ") and ending.detail.endswith(".0")
    assert control.requested(Stop.CANCELLED)
    assert control.may_start(None, NOW) == f"the run is halting ({ending.detail}) before it started"
