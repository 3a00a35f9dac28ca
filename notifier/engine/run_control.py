"""The run control: the one holder and writer of a working process's stop state, and the one
place every check reads it (docs/design.md, "The run control").

Whatever asks a run to stop, from whichever thread, calls `request`: a signal handler
(Ctrl-C, SIGTERM), the lease's heartbeat or a sender that found the lease lost or stale, a
sender whose answer halts the run, the committer's brakes and judgement, a cancel or another
worker's move the committer read, a --rate wait past --max-wait. Every check reads it: a
sender right before its request leaves (`may_start`) or before a status query (`may_ask`),
the committer between commits (`stopping`, then `ending` once nothing is in flight), and
every wait (`wait`), which a request ends at once.

A stop, once requested, stays requested: the process finishes what is in flight and ends
as its strongest cause says. The strongest wins whenever they came, so the ending does not
depend on which of two racing threads was first; among causes of one strength the first
stands. The approval's expiry is the one cause that is a moment rather than an event: it is
read against the clock at each check, so a renewal read before it passes counts.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from itertools import count
from typing import NamedTuple

from notifier.domain.records import Item
from notifier.domain.state_machine import RunState
from notifier.engine.deadlines import past_deadline
from notifier.store import LeaseLost, LossCause

__all__ = ["SIGNAL_NAMES", "Brake", "RunControl", "Stop", "StopRequest"]

SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class Stop(StrEnum):
    """Why a run stopped, or is stopping. The CLI turns an ending's (with the counts) into
    the exit code and the advice to print; the engine decides neither. Stored as the run's
    StopCause (records.py) when the ending moves the run."""

    COMPLETED = "completed"  # every item settled (some may have failed)
    UNKNOWN_LEFT = "unknown_left"  # paused: unknown items wait for a reconcile
    RATE_LIMITED = "rate_limited"  # paused: a Retry-After longer than --max-wait
    INTERRUPTED = "interrupted"  # Ctrl-C: paused cleanly
    TERMINATED = "terminated"  # SIGTERM: paused cleanly, like a first Ctrl-C
    APPROVAL_EXPIRED = "approval_expired"  # paused: no send starts without a valid approval
    CHANNEL_DOWN = "channel_down"  # paused: a channel's receiver cannot be reached
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"  # finished by someone else before we started
    HALTED = "halted"  # a safety rule: endpoint gone, too many unknowns in a row
    CONFLICT = "conflict"  # halted: the downstream holds another intent under our key
    LEFT = "left"  # a worker of a shared run left it to the other workers
    # This process lost its lease (taken over, gone stale): it ends in LeaseLost, exit 4;
    # the JSON log's ending event says so, as it says any other ending.
    LEASE_LOST = "lease_lost"
    # Another worker halted, paused or closed a shared run: this one ends as that move says
    # (a request only; the ending's stop is the one the move stored).
    MOVED = "moved"


# How strong each cause is: the strongest requested decides the ending. A lost lease ends
# the process at once (nothing more can be recorded); a safety halt judged by the committer
# beats an operator's stop, which beats another worker's move, which beats a cancel; a
# sender's early reading of a halting answer (`provisional`) comes next, the run's own
# pauses last. A conflict outranks the other halts: it names what is wrong (exit 4).
_STRENGTH: dict[Stop, int] = {
    Stop.LEASE_LOST: 8,
    Stop.CONFLICT: 7,
    Stop.HALTED: 6,
    Stop.CHANNEL_DOWN: 6,
    Stop.INTERRUPTED: 5,
    Stop.TERMINATED: 5,
    Stop.MOVED: 4,
    Stop.CANCELLED: 3,
    Stop.RATE_LIMITED: 1,
    Stop.APPROVAL_EXPIRED: 0,
}
_PROVISIONAL = 2
# How soon a wait notices a signal: its handler sets no event (see RunControl.interrupt).
_SIGNAL_LOOK_S = 0.05
# The causes a status query is still asked under: none. Every one of them stops sends too,
# except a --rate pause: the items already claimed of other channels still go out (the
# committer claims nothing new), while their queries, each up to three timeouts, would
# hold the pause up.
_SENDS_GO_ON = frozenset({Stop.RATE_LIMITED})


class Brake(NamedTuple):
    """A rule's verdict that the run must stop: the cause, and why in words for people."""

    cause: Stop
    detail: str


@dataclass(frozen=True)
class StopRequest:
    """One cause requested: why, in words for people, and what its ending needs."""

    cause: Stop
    detail: str
    order: int  # when it came, among the others (first stands among equals)
    until: float | None = None  # RATE_LIMITED: the monotonic time the run pauses until
    moved_to: RunState | None = None  # MOVED: the state the other worker moved the run to
    loss: LossCause | None = None  # LEASE_LOST: why
    provisional: bool = False  # a sender's reading, before the committer judged the answer

    @property
    def strength(self) -> int:
        return _PROVISIONAL if self.provisional else _STRENGTH.get(self.cause, 0)


class RunControl:
    """The stop state of one working process (a sender of a run, or a drafting pass): the
    causes requested, the first signal, the approval's expiry. Thread-safe; a signal
    handler's request takes no lock (it runs between two bytecodes of the main thread,
    which may hold it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[Stop, StopRequest] = {}  # the first request of each cause
        self._order = count()
        self._stopped = threading.Event()  # set by the first request: every wait ends now
        self._signal: signal.Signals | None = None  # the first SIGINT or SIGTERM
        self._signal_order = 0
        # The run's approval (approval.Watch): at or after this moment no send starts.
        self._approval_until: datetime | None = None
        self._approval_reason = ""
        self._renewal_failing = False  # the heartbeat's last renewal failed

    # ------------------------------------------------------------------ requests

    def request(
        self,
        cause: Stop,
        detail: str,
        *,
        until: float | None = None,
        moved_to: RunState | None = None,
        loss: LossCause | None = None,
        provisional: bool = False,
    ) -> None:
        """Ask the run to stop for `cause`: from now on no send starts, and every wait ends.
        A cause asked again keeps its first detail."""
        with self._lock:
            asked = self._requests.get(cause)
            # The first stands, but a judged cause replaces a sender's provisional reading.
            if asked is not None and (provisional or not asked.provisional):
                return
            self._requests[cause] = StopRequest(
                cause, detail, next(self._order), until, moved_to, loss, provisional
            )
        self._stopped.set()

    def interrupt(self, signum: signal.Signals) -> bool:
        """A SIGINT or SIGTERM arrived: whether it is the first (the second one leaves at
        once). Called from the signal handler, which runs between two bytecodes of the main
        thread: that thread may hold this control's lock, or the event's own (inside
        `wait`), so it takes neither: two assignments, read by every check, and every wait
        looks for them at least every _SIGNAL_LOOK_S."""
        if self._signal is not None:
            return False
        self._signal_order = next(self._order)
        self._signal = signum
        return True

    def lose(self, loss: LossCause) -> None:
        """This process learned it no longer holds its lease (the first cause found stands):
        no send starts, and the heartbeat renews nothing, from now on."""
        self.request(Stop.LEASE_LOST, str(loss), loss=loss)

    def lose_stale(self) -> None:
        """The lease was not renewed for longer than a send may trust it: because this
        process was not running (stopped, stalled), or because its renewals failed."""
        self.lose(LossCause.UNKEPT if self._renewal_failing else LossCause.STALE)

    def renewed(self, *, ok: bool) -> None:
        """What the heartbeat's last renewal did: a lease gone stale while renewals failed
        went stale while this process was running (UNKEPT, not STALE)."""
        self._renewal_failing = not ok

    def expires_at(self, until: datetime | None, reason: str) -> None:
        """The run's approval holds until `until` (None: the run needs none); `reason` is why
        the run pauses once it has passed."""
        with self._lock:
            self._approval_until = until
            self._approval_reason = reason

    @contextmanager
    def marking(self) -> Iterator[None]:
        """The one place a loss found by the work in the block (a fence, the flags, a failed
        write) is recorded, with its cause, first as it leaves: no sender starts the item it
        just took from its queue, and the heartbeat renews nothing from then on."""
        try:
            yield
        except LeaseLost as lost:
            self.lose(lost.cause)
            raise

    # ------------------------------------------------------------------ reads

    def _all(self, now: datetime | None) -> list[StopRequest]:
        """Every cause in force, strongest first (first first among equals)."""
        with self._lock:
            found = list(self._requests.values())
            until, reason = self._approval_until, self._approval_reason
        if self._signal is not None:
            cause = Stop.TERMINATED if self._signal == signal.SIGTERM else Stop.INTERRUPTED
            found.append(StopRequest(cause, SIGNAL_NAMES[self._signal], self._signal_order))
        if until is not None and now is not None and now >= until:
            # The one cause of its strength: its order does not matter.
            found.append(StopRequest(Stop.APPROVAL_EXPIRED, reason, order=0))
        return sorted(found, key=lambda r: (-r.strength, r.order))

    def ending(self, now: datetime) -> StopRequest | None:
        """The cause the run ends for (the strongest in force at `now`), or None."""
        found = self._all(now)
        return found[0] if found else None

    def stopping(self, now: datetime) -> bool:
        """Whether a stop is in force at `now`: no new item is claimed or started."""
        return self._stopped.is_set() or self.ending(now) is not None  # a signal, an expiry

    def requested(self, cause: Stop) -> bool:
        """Whether `cause` was requested (by a request or a signal)."""
        return any(r.cause is cause for r in self._all(None))

    @property
    def lost(self) -> bool:
        """Whether this process has learned it lost its lease."""
        return Stop.LEASE_LOST in self._requests

    @property
    def loss(self) -> LossCause | None:
        request = self._requests.get(Stop.LEASE_LOST)
        return None if request is None else request.loss

    @property
    def signalled(self) -> bool:
        """Whether a SIGINT or SIGTERM arrived (what a drafting pass stops for)."""
        return self._signal is not None

    @property
    def first_signal(self) -> signal.Signals | None:
        """The first SIGINT or SIGTERM, if one arrived."""
        return self._signal

    @property
    def signal_name(self) -> str:
        """The first signal as people know it ("Ctrl-C" until one arrived)."""
        return SIGNAL_NAMES[self._signal or signal.SIGINT]

    def lost_error(self, run_id: str, then: str = "") -> LeaseLost:
        """The LeaseLost a run ends with on this loss: why, and `then` what it left."""
        cause = self.loss or LossCause.TAKEN_OVER
        return LeaseLost(f"run {run_id}: {cause}{then}", cause)

    def may_start(self, item: Item | None, now: datetime) -> str | None:
        """Why a send must not start at `now`, or None: any cause in force that stops sends,
        or (for `item`) its not_after passed. Asked right before each request leaves."""
        for r in self._all(now):
            if r.cause in _SENDS_GO_ON and not r.provisional:
                continue
            return _why_not_started(r)
        return None if item is None else past_deadline(item, now)

    def may_ask(self, now: datetime) -> bool:
        """Whether a status query may start (or try again): not once any stop is in force,
        when each query, tried three times, may take the channel's timeout while the stop
        waits."""
        return not self.stopping(now)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds, ended at once by a request: whether one has come."""
        deadline = time.monotonic() + timeout
        while not self._stopped.is_set() and self._signal is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._stopped.wait(min(left, _SIGNAL_LOOK_S))
        return True


def _why_not_started(r: StopRequest) -> str:
    """A send held back by `r`, in words (the attempt's reason, the logs)."""
    if r.cause in (Stop.INTERRUPTED, Stop.TERMINATED):
        return f"interrupted ({r.detail}) before it started"
    if r.cause is Stop.LEASE_LOST:
        return "this worker can no longer prove the run is its own"
    if r.cause is Stop.APPROVAL_EXPIRED:
        return "the run's approval expired before it started"
    if r.cause is Stop.CANCELLED:
        return f"cancel requested at {r.detail}"
    if r.cause is Stop.MOVED:
        return f"the run was {r.detail} by another worker before it started"
    return f"the run is halting ({r.detail}) before it started"
