"""How one process coordinates a run with whoever else may move it: two strategies, chosen
once when the runner is built (`for_run`).

- `Sole`: this process holds the run's one lease (SQLite, or a PostgreSQL run sent alone).
  Every move is its own; a lease version that moved means another process took over.
- `Shared`: a PostgreSQL run that several workers send together, each on a worker lease of
  its own. A move lands only from `running` (another worker may have moved the run first,
  and this one then ends as that move says); dead workers' items are adopted and settled;
  a worker that stops leaves the run to the others unless it is the last.

Both end a run the same way (pause, halt, finish, cancel); only the steps above differ.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from notifier.channels import Channel
from notifier.domain import clock
from notifier.domain.records import Counts, Item, Run, StopCause, unknown_left_reason
from notifier.domain.state_machine import ItemTrigger, RunState, RunTrigger
from notifier.engine.brakes import conflict
from notifier.engine.judging import Progress
from notifier.engine.membership import holder_alive
from notifier.engine.pipeline import SharedBucket, TokenBucket
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.settle_by_query import Asking, settle, settle_doubts, settle_items, settle_left
from notifier.store import Adopted, LeaseLost, LossCause, Store, WorkerFence

# The cause stored with each way a run stops short (runs.stop_cause).
CAUSES: Mapping[Stop, StopCause] = {
    Stop.RATE_LIMITED: StopCause.RATE_LIMITED,
    Stop.APPROVAL_EXPIRED: StopCause.APPROVAL_EXPIRED,
    Stop.CHANNEL_DOWN: StopCause.CHANNEL_DOWN,
    Stop.INTERRUPTED: StopCause.INTERRUPTED,
    Stop.TERMINATED: StopCause.INTERRUPTED,
    Stop.UNKNOWN_LEFT: StopCause.UNKNOWN_LEFT,
    Stop.HALTED: StopCause.HALTED,
    Stop.CONFLICT: StopCause.CONFLICT,
    Stop.CANCELLED: StopCause.CANCELLED,
}
# How a worker that finds the run paused by another ends, by the pause's cause (any other,
# or none recorded: it waits for a reconcile).
_PAUSED_BY_ANOTHER: Mapping[StopCause, Stop] = {
    StopCause.RATE_LIMITED: Stop.RATE_LIMITED,
    StopCause.APPROVAL_EXPIRED: Stop.APPROVAL_EXPIRED,
    StopCause.CHANNEL_DOWN: Stop.CHANNEL_DOWN,
    StopCause.INTERRUPTED: Stop.LEFT,
}
# How often a worker of a shared run looks for dead workers whose items it must settle.
REAP_S = 1.0
# How long the last worker of a cancelled shared run goes on looking for a dead worker whose
# items it cannot adopt yet (its transaction still open: the server ends such a session
# within seconds, postgres.IDLE_IN_WRITE_S) before it closes the run all the same.
CANCEL_ADOPT_S = 15.0


@dataclass(frozen=True)
class RunOptions:
    concurrency: int = 1
    max_wait_s: float = 600.0
    unknown_streak_limit: int = 5
    rate: float | None = None  # --rate: sends per second per channel (over its own `rate`)
    # `resume` restarts a paused or halted run; a `worker` only joins one that is going, so a
    # halt (an endpoint gone, a conflict) holds until an operator resumes the run.
    restart: bool = True


@dataclass(frozen=True)
class RunResult:
    """How a run stopped: its state, why, what happened (no command hints) and the counts."""

    state: RunState
    stop: Stop
    reason: str
    counts: Counts
    paused_until: str | None = None
    # Of the unknown items, how many wait only for their query window (the receiver may
    # still commit them until then) and when the last window passes: a plain reconcile
    # settles those by query then. None when none waits for that (settle_by_query).
    settle_later: tuple[int, datetime] | None = None
    # When a not-sent mark is taken for the unknown items no query settles (the receiver
    # can no longer commit them then); None when it is taken now (settle_by_query).
    marks_from: datetime | None = None


class Coordination:
    """The run-level moves of one sending process; the strategies below differ only in how
    they start, watch, move and leave the run."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        channels: Mapping[str, Channel],
        lease_version: int,
        progress: Progress,
        options: RunOptions,
        control: RunControl,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.channels = channels
        self.lease_version = lease_version
        self.p = progress
        self.options = options
        self.control = control
        # Per channel, when the run's last request on it that may have left started (read
        # once, for the channel's bucket and every domain bucket of it: `bucket`).
        self._last_start: dict[str, str | None] = {}

    @property
    def asking(self) -> Asking:
        """A settling pass's queries honour (and close) the runner's gates, and what they
        settle is observed; each pass has its own wait for gates."""
        return Asking(gates=self.p, told=self.p.settled)

    # ------------------------------------------------------------------ the strategy

    def start(self, run: Run) -> RunState:
        """Move the run to running; the state it is in after (running, or another's move)."""
        raise NotImplementedError

    def settle_open(self) -> None:
        """Settle every item whose outcome is open before anything new starts; a conflict
        found halts the run (asked of the run control)."""
        raise NotImplementedError

    def signals(self) -> tuple[str | None, RunState | None]:
        """The run's cancel request, and the state another process moved it to (None while
        it is running as this process left it)."""
        raise NotImplementedError

    def move(self, trigger: RunTrigger, **sets: str | None) -> RunState:
        raise NotImplementedError

    def stop(self, trigger: RunTrigger, stop: Stop, reason: str | None, **sets: str) -> RunState:
        """`move` for a stop: its reason, with the cause it stores."""
        return self.move(trigger, stop_reason=reason, stop_cause=CAUSES[stop], **sets)

    def leave(self, *, wait_for_busy: bool) -> str:
        """ "left" (the others finish the run), "wait" (others still hold items) or "last"."""
        return "last"

    def watch(self) -> list[Item]:
        """What other processes did that this one must heed, at each revisit: the items
        it adopted from dead workers, to settle by query before it sends any of them."""
        return []

    def may_close(self, counts: Counts) -> bool:
        """Whether the run may be closed with these counts, nothing left to claim."""
        return True

    def bucket(
        self, channel: str, rate: float, domain: str | None = None
    ) -> TokenBucket | SharedBucket:
        """The bucket of this process for `channel` (or for its sends to `domain`: a domain
        rate), holding no more than the rate has refilled since the run's last request on
        that channel that may have left, whichever process sent it: a pause, a Ctrl-C or a
        kill -9 and a resume never sends faster than the rate. A domain's bucket counts
        from the channel's last request, to any domain: it may hold fewer tokens than its
        own last request would give it, never more."""
        if channel not in self._last_start:
            self._last_start[channel] = self.store.queries.last_start(self.run_id, channel)
        last = self._last_start[channel]
        if last is None:
            return TokenBucket(rate)
        since = (clock.now() - clock.parse(last)).total_seconds()
        return TokenBucket(rate, max(0.0, since) * rate)

    def close(self) -> None:
        """Release what the strategy opened."""

    # ------------------------------------------------------------------ endings

    def pause(
        self, stop: Stop, reason: str, said: str, *, paused_until: str | None = None
    ) -> RunResult:
        """Pause the run for `reason` (stored, for `status` and the other workers); if
        another worker moved it first, end as that move says."""
        sets = {"paused_until": paused_until} if paused_until else {}
        moved = self.stop(RunTrigger.PAUSE, stop, reason, **sets)
        if moved is not RunState.PAUSED:
            return self.moved_by_another(moved)
        counts = self.store.queries.counts(self.run_id)
        return RunResult(RunState.PAUSED, stop, said, counts, paused_until=paused_until)

    def halt(self, stop: Stop, reason: str) -> RunResult:
        """End the run for a safety rule: halted; or, for a channel that is down (nothing
        is wrong with its items), paused, so that `resume` goes on once it is back."""
        if stop is Stop.CHANNEL_DOWN:
            return self.pause(stop, reason, f"paused: {reason}")
        moved = self.stop(RunTrigger.HALT, stop, reason)
        if moved is not RunState.HALTED:
            return self.moved_by_another(moved)
        return RunResult(
            RunState.HALTED, stop, f"halted: {reason}", self.store.queries.counts(self.run_id)
        )

    def finish(self) -> RunResult | None:
        """Close the run: nothing is left to send. None while other workers of a shared run
        still hold items (this one waits for them, or for their leases to die)."""
        counts = self.store.queries.counts(self.run_id)
        if not self.may_close(counts):
            return None
        summary = counts.summary()
        if counts.unknown:
            reason = unknown_left_reason(counts.unknown)
            moved = self.stop(RunTrigger.PAUSE, Stop.UNKNOWN_LEFT, reason)
            if moved is not RunState.PAUSED:
                return self.moved_by_another(moved)
            return RunResult(RunState.PAUSED, Stop.UNKNOWN_LEFT, summary, counts)
        moved = self.move(RunTrigger.COMPLETE)
        if moved is not RunState.COMPLETED:
            return self.moved_by_another(moved)
        return RunResult(RunState.COMPLETED, Stop.COMPLETED, f"completed: {summary}", counts)

    def finish_cancel(self) -> RunResult:
        """Close a cancelled run, having asked first about what may have been delivered:
        the items left unknown or mid-request (`settle_unknown`: the revisits stop once the
        run is stopping, and an item a query settles is never left for a person), then
        those waiting to retry after an uncertain attempt, settled by query or made unknown
        (settle_doubts)."""
        self.settle_unknown()
        settle_doubts(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            say=self.p.say,
            asking=self.asking,
        )
        self.stop(RunTrigger.CANCEL, Stop.CANCELLED, None)
        counts = self.store.queries.counts(self.run_id)
        kinds = list(self.store.queries.pending_kinds(self.run_id).values())
        return RunResult(
            RunState.CANCELLED,
            Stop.CANCELLED,
            "cancelled: " + counts.cancel_summary(kinds),
            counts,
        )

    def settle_unknown(self) -> None:
        """Before a cancel closes the run: ask now about every item left unknown or
        mid-request on a channel that can be asked (settle_left, waiting for no window:
        what a 404 cannot settle yet stays unknown, and the advice names the moment a plain
        reconcile settles it). This process is the only one: its own sends are all recorded
        by now, nothing else is in flight."""
        settle_left(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            [],
            self.p.say,
            wait_until=clock.now(),
            asking=self.asking,
        )

    def lost(self, lost: LeaseLost) -> RunResult:
        """This process's ending on a lost lease: the run as its new holder keeps it."""
        try:
            state = self.store.core.get_run(self.run_id).state
            counts = self.store.queries.counts(self.run_id)
        except Exception:  # the database may be what cut this process off
            state, counts = RunState.RUNNING, Counts()
        return RunResult(state, Stop.LEASE_LOST, str(lost), counts)

    def left(self, stop: Stop, reason: str) -> RunResult:
        """This worker left the run to the others, which end it."""
        counts = self.store.queries.counts(self.run_id)
        return RunResult(self.store.core.get_run(self.run_id).state, stop, reason, counts)

    def moved_by_another(self, state: RunState) -> RunResult:
        """This worker's ending when another worker (or a cancel) moved the run first."""
        run = self.store.core.get_run(self.run_id)
        counts = self.store.queries.counts(self.run_id)
        reason = f"{state.value} by another worker: {run.stop_reason or counts.summary()}"
        stop = {
            RunState.COMPLETED: Stop.COMPLETED,
            RunState.CANCELLED: Stop.CANCELLED,
            RunState.HALTED: Stop.HALTED,
        }.get(state)
        if stop is Stop.HALTED and run.stop_cause is StopCause.CONFLICT:
            stop = Stop.CONFLICT  # halted for a conflict: every worker ends as the one that met it
        if stop is None and run.stop_cause is not None:  # paused: the cause it was paused for
            stop = _PAUSED_BY_ANOTHER.get(run.stop_cause)
        if stop is None:
            stop = Stop.UNKNOWN_LEFT
        return RunResult(state, stop, reason, counts, paused_until=run.paused_until)


class Sole(Coordination):
    """One process holds the run: every move is its own, from wherever the run is."""

    def start(self, run: Run) -> RunState:
        if run.state in (RunState.PLANNED, RunState.APPROVED):
            self.store.ledger.move_run(self.run_id, RunTrigger.START, self.lease_version)
        elif run.state in (RunState.PAUSED, RunState.HALTED):
            self.store.ledger.move_run(
                self.run_id,
                RunTrigger.RESUME,
                self.lease_version,
                paused_until=None,
                stop_reason=None,
                stop_cause=None,
            )
        return RunState.RUNNING

    def settle_open(self) -> None:
        settlements = settle(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            include_unknown=True,
            say=self.p.say,
            asking=self.asking,
        )
        for s in settlements:
            if s.outcome is not None and s.outcome.trigger == ItemTrigger.CONFLICT:
                self.control.request(*conflict(s.outcome))

    def signals(self) -> tuple[str | None, RunState | None]:
        cancel, version = self.store.queries.run_flags(self.run_id)
        if version != self.lease_version:
            raise LeaseLost(f"run {self.run_id}: {LossCause.TAKEN_OVER}", LossCause.TAKEN_OVER)
        return cancel, None

    def move(self, trigger: RunTrigger, **sets: str | None) -> RunState:
        return self.store.ledger.move_run(self.run_id, trigger, self.lease_version, **sets)


class Shared(Coordination):
    """Many workers send one run (PostgreSQL), each on a worker lease of its own
    (`worker_id`, which fences `store`): each move only from `running`, dead workers' items
    adopted."""

    _reap_at = 0.0  # when next to look for dead workers (monotonic clock)
    # The --rate buckets live in the database: the senders take their tokens through a
    # connection of their own (the committer's is busy committing), one at a time. Both
    # made by the first bucket (while the runner is built, before any sender starts).
    _bucket_store: Store | None = None
    _bucket_lock: threading.Lock

    def __init__(
        self,
        worker_id: str,
        store: Store,
        run_id: str,
        channels: Mapping[str, Channel],
        lease_version: int,
        progress: Progress,
        options: RunOptions,
        control: RunControl,
    ) -> None:
        super().__init__(store, run_id, channels, lease_version, progress, options, control)
        self.worker_id = worker_id

    def start(self, run: Run) -> RunState:
        start = (RunState.PLANNED, RunState.APPROVED)
        self.store.ledger.move_run_from(self.run_id, RunTrigger.START, self.lease_version, start)
        if self.options.restart:
            self.store.ledger.move_run_from(
                self.run_id,
                RunTrigger.RESUME,
                self.lease_version,
                (RunState.PAUSED, RunState.HALTED),
                paused_until=None,
                stop_reason=None,
                stop_cause=None,
            )
        return self.store.core.get_run(self.run_id).state

    def settle_open(self) -> None:
        """Every item whose outcome is open that no live worker holds, adopted first."""
        self.adopt_and_settle()

    def signals(self) -> tuple[str | None, RunState | None]:
        """As Sole's, with this worker's own lease in the same read: reaped (its version
        moved), it stops at this look, never later than its next renewal would tell it."""
        cancel, state, version = self.store.queries.worker_signals(self.run_id, self.worker_id)
        if version != self.lease_version:
            raise LeaseLost(f"run {self.run_id}: {LossCause.TAKEN_OVER}", LossCause.TAKEN_OVER)
        return cancel, None if state is RunState.RUNNING else state

    def move(self, trigger: RunTrigger, **sets: str | None) -> RunState:
        """Only from `running`: another worker may have moved the run first (then its
        state is returned, unchanged)."""
        return self.store.ledger.move_run_from(
            self.run_id, trigger, self.lease_version, (RunState.RUNNING,), **sets
        )

    def leave(self, *, wait_for_busy: bool) -> str:
        return self.store.leases.leave_unless_last(
            self.run_id,
            self.worker_id,
            self.lease_version,
            holder_alive,
            wait_for_busy=wait_for_busy,
        )

    def watch(self) -> list[Item]:
        """Gates closed by other workers' throttled answers count here too; dead workers'
        items are adopted at most every REAP_S (the runner hands them to its senders to ask
        about: a query never runs on the committer's thread mid-run)."""
        for channel, until in self.store.queries.channel_gates(self.run_id).items():
            self.p.gate(channel, time.monotonic() + clock.seconds_until(clock.parse(until)))
        if time.monotonic() < self._reap_at:
            return []
        self._reap_at = time.monotonic() + REAP_S
        return self.adopt()

    def finish(self) -> RunResult | None:
        ending = self.leave(wait_for_busy=True)
        if ending == "wait":
            return None
        if ending == "left":
            return self.left(
                Stop.LEFT,
                "stopped, not done: nothing is left for this worker to send, and the other "
                "live workers are still sending the run",
            )
        if self.adopt_and_settle():
            return None  # settled what a dead worker left: look again before closing
        return super().finish()

    def may_close(self, counts: Counts) -> bool:
        return not counts.in_flight  # held by a worker not yet known dead: wait for it

    def settle_unknown(self) -> None:
        """The last live worker, before it closes a cancelled run, settles what dead workers
        left in flight (it may have been delivered): adopted now, or adopted earlier and left
        unasked because the run was stopping (this worker's own sends are all recorded by
        now: whatever it holds in flight is adopted). A dead worker whose transaction is
        still open is fenced out at a later look, every REAP_S, for at most CANCEL_ADOPT_S.
        Then asked about, and asked again once a 404 counts (settle_left): never left in
        flight, nor reported pending while it may have been delivered."""
        deadline = time.monotonic() + CANCEL_ADOPT_S
        self.adopt()
        while self._others_in_flight() and time.monotonic() < deadline:
            time.sleep(REAP_S)
            self.adopt()
        seqs = sorted(self.store.leases.held_in_flight(self.run_id, self.worker_id))
        items = [self.store.queries.item(self.run_id, seq) for seq in seqs]
        settle_left(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            items,
            self.p.say,
            asking=self.asking,
        )

    def _others_in_flight(self) -> bool:
        """Whether items are in flight under another worker (one not fenced out yet)."""
        mine = len(self.store.leases.held_in_flight(self.run_id, self.worker_id))
        return self.store.queries.counts(self.run_id).in_flight > mine

    def adopt(self) -> list[Item]:
        """Fence out dead workers and adopt what they left in flight (and unknown items no
        live worker holds), in one transaction: the items to settle by query before this
        worker sends any of them (claims take pending items only)."""
        adopted = self.store.leases.adopt_orphans(
            self.run_id, self.worker_id, self.lease_version, holder_alive
        )
        if adopted.seqs:
            self.p.say(_settling(adopted))
        return [self.store.queries.item(self.run_id, seq) for seq in adopted.seqs]

    def adopt_and_settle(self) -> bool:
        """`adopt`, and settle what was adopted by query here, before this worker sends
        anything (at its start) or closes the run (at its finish). Whether anything was
        adopted."""
        items = self.adopt()
        if not items:
            return False
        for s in settle_items(
            self.store,
            self.run_id,
            self.channels,
            self.lease_version,
            items,
            self.p.say,
            asking=self.asking,
        ):
            if s.outcome is not None and s.outcome.trigger == ItemTrigger.CONFLICT:
                self.control.request(*conflict(s.outcome))
        return True

    def bucket(
        self, channel: str, rate: float, domain: str | None = None
    ) -> TokenBucket | SharedBucket:
        """One bucket in the database for all the run's workers (so ten workers do not send
        ten times the rate), keyed by its channel, or `CHANNEL@DOMAIN` for a domain rate
        (rate_buckets: no channel's own bucket can be named so)."""
        if self._bucket_store is None:
            concurrent = self.options.concurrency > 1
            self._bucket_store = self.store.secondary() if concurrent else self.store
            self._bucket_lock = threading.Lock()
        name = channel if domain is None else f"{channel}@{domain}"
        return SharedBucket(self._bucket_store, self._bucket_lock, self.run_id, name, rate)

    def close(self) -> None:
        if self._bucket_store is not None and self._bucket_store is not self.store:
            self._bucket_store.close()


def _settling(adopted: Adopted) -> str:
    """What a worker adopting items says: how many, and who left them (how many workers,
    which died and which exited; a worker that exited left unknown items to settle)."""
    said = f"settling {len(adopted.seqs)} item(s)"
    workers = adopted.died + adopted.exited
    if workers == 1:
        said += f" left by a worker that {'died' if adopted.died else 'exited'}"
    elif workers and not (adopted.died and adopted.exited):
        said += f" left by {workers} workers that {'died' if adopted.died else 'exited'}"
    elif workers:
        said += (
            f" left by {workers} workers: {_how_many(adopted.died)} that died, "
            f"{_how_many(adopted.exited)} that exited"
        )
    if adopted.unheld:
        said += f"{', and' if workers else ''} {adopted.unheld} held by no worker"
    return said


def _how_many(n: int) -> str:
    return "one" if n == 1 else str(n)


def for_run(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    progress: Progress,
    options: RunOptions,
    control: RunControl,
) -> Coordination:
    """The strategy for this process: shared when `store` is fenced by a worker lease of its
    own (a PostgreSQL `worker`, or `send`/`resume` on a run workers share: SharedLease's
    store), else sole. The fencing is fixed when the store is made, so this choice is too."""
    fencing = store.fencing
    if isinstance(fencing, WorkerFence):
        return Shared(
            fencing.worker_id, store, run_id, channels, lease_version, progress, options, control
        )
    return Sole(store, run_id, channels, lease_version, progress, options, control)
