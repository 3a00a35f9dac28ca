"""Stopping and settling a run: `cancel`, `reconcile` by query, and the decisions by hand
that `reconcile --manual` (manual.py) records."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from notifier.api.env import Env, open_store, pick_run
from notifier.api.working import run_channel, run_channels, take_lease
from notifier.channels import Channel
from notifier.domain import clock
from notifier.domain.errors import BadInput, NextStep, Refused
from notifier.domain.records import (
    AttemptOutcome,
    Counts,
    Item,
    Run,
    StopCause,
    unknown_left_reason,
)
from notifier.domain.state_machine import (
    FINISHED_RUN_STATES,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
)
from notifier.domain.who import operator_name
from notifier.engine.membership import SoleLease, live_holder
from notifier.engine.settle_by_query import (
    not_found_counts_from,
    settle,
    settle_doubts,
    settle_left,
    unknown_waits,
)
from notifier.ops.report import effective_state
from notifier.store import LeaseHeld, Store


@dataclass(frozen=True)
class CancelResult:
    run: Run
    confirmed: bool  # no request of the run can start any more (else: look, or wait longer)
    message: str
    counts: Counts
    # Of its unknown items, how many a plain reconcile settles by query once their window
    # has passed, and when the last one's passes (the command words the advice).
    settle_later: tuple[int, datetime] | None = None
    marks_from: datetime | None = None  # when a not-sent mark is taken (RunResult's)


def cancel(env: Env, run_id: str | None, wait_s: float) -> CancelResult:
    """Returns once no request of the run can start any more (the worker moved the run to
    cancelled, or there was no worker and this process did), or says that the worker did not
    confirm in time (exit 3). A run that finished meanwhile is reported as it is."""
    store = open_store(env)
    try:
        run = pick_run(store, run_id, active_only=True)
        if run.state in FINISHED_RUN_STATES or not store.ledger.request_cancel(run.run_id):
            return _already_finished(store, store.core.get_run(run.run_id))
        deadline = time.monotonic() + wait_s
        while True:
            run, holder = _wait_for_worker(store, run.run_id, deadline)
            if run.state in FINISHED_RUN_STATES:
                break
            if holder is not None:
                return CancelResult(
                    run,
                    False,
                    f"run {run.run_id}: cancel recorded, but the worker (pid "
                    f"{holder.get('pid')} on {holder.get('host')}) did not "
                    f"confirm within {wait_s:g}s, so a request may still start until it does.",
                    store.queries.counts(run.run_id),
                )
            try:
                run = _cancel_without_worker(env, store, run, deadline)
                break
            except LeaseHeld:
                # A `send` or `resume` took the lease between our look and our take (e.g. a
                # send that had just planned the run): it sees the flag; wait for it instead.
                continue
        if run.state is not RunState.CANCELLED:
            return _already_finished(store, run)
        later, marks_from = None, None  # what its unknown items wait for (unknown_waits)
        if store.queries.counts(run.run_id).unknown:
            with run_channels(run, env, tolerate_broken=True) as channels:
                later, marks_from = unknown_waits(store, run.run_id, channels)
        counts = store.queries.counts(run.run_id)
        kinds = list(store.queries.pending_kinds(run.run_id).values())
        message = f"run {run.run_id} cancelled: {counts.cancel_summary(kinds)}."
        return CancelResult(run, True, message, counts, later, marks_from)
    finally:
        store.close()


def _already_finished(store: Store, run: Run) -> CancelResult:
    return CancelResult(
        run,
        True,
        f"run {run.run_id} is already {run.state.value}; nothing to cancel.",
        store.queries.counts(run.run_id),
    )


def _wait_for_worker(
    store: Store, run_id: str, deadline: float
) -> tuple[Run, dict[str, Any] | None]:
    """The run once it is finished, nobody works it any more, or `deadline` has passed,
    with who still works it (None: nobody). The run is read after the last look for its
    worker: one that closed the run and left before that look moved it first, so a run
    read unfinished with nobody at work has no worker left to finish it (taking it over
    then never writes the chain of a run already closed, which a keyed run's refuses
    without the key)."""
    run = store.core.get_run(run_id)
    while True:
        holder = live_holder(store, run)
        run = store.core.get_run(run_id)
        if run.state in FINISHED_RUN_STATES or holder is None or time.monotonic() >= deadline:
            return run, holder
        time.sleep(0.05)


def _cancel_without_worker(env: Env, store: Store, run: Run, deadline: float) -> Run:
    """No live worker: settle what it left in flight (and every maybe-delivered item waiting
    to retry) by query, asking again, until the `deadline` of --wait at most, about each
    whose 404 could not count yet (a request that never left then ends never delivered,
    not unknown), then mark the run cancelled. Raises LeaseHeld if a worker took the run
    meanwhile."""
    with run_channels(run, env, tolerate_broken=True) as channels:
        lease = SoleLease(store, run.run_id, env.config.lease_ttl_s)
        with lease:
            if store.core.get_run(run.run_id).state in FINISHED_RUN_STATES:
                return store.core.get_run(run.run_id)  # a worker completed it first
            settle(store, run.run_id, channels, lease.version, include_unknown=True, say=env.say)
            until = clock.later(max(0.0, deadline - time.monotonic()))
            settle_left(store, run.run_id, channels, lease.version, [], env.say, wait_until=until)
            settle_doubts(store, run.run_id, channels, lease.version, say=env.say)
            store.ledger.move_run(
                run.run_id,
                RunTrigger.CANCEL,
                lease.version,
                stop_reason=None,
                stop_cause=StopCause.CANCELLED,
            )
    return store.core.get_run(run.run_id)


# ---------------------------------------------------------------------- reconcile


@dataclass(frozen=True)
class Reconciled:
    run: Run
    counts: Counts
    # Unknown items per channel that cannot be asked whether a message arrived (SMTP and
    # Apprise answer no such query): only a decision by hand settles them.
    unqueryable: Mapping[str, int]
    # The run's state as `status` shows it once the reconcile let go of the run: a run left
    # `running` by a process that is gone is paused (report.effective_state).
    shown: RunState


def reconcile_by_query(env: Env, run_id: str | None) -> Reconciled:
    store = open_store(env)
    try:
        run = pick_run(store, run_id)
        with (
            run_channels(run, env) as channels,
            take_lease(store, run, env.config.lease_ttl_s) as lease,
        ):
            settlements = settle(
                store, run.run_id, channels, lease.version, include_unknown=True, say=env.say
            )
            blind = _unknown_on_unqueryable(store, run.run_id, channels)
            if not settlements and not blind:
                env.say("nothing to settle: no item is in flight or unknown.")
            complete_if_done(store, run.run_id, lease.version)
        now = store.core.get_run(run.run_id)
        counts = store.queries.counts(run.run_id)
        return Reconciled(now, counts, blind, effective_state(store, now))
    finally:
        store.close()


def _unknown_on_unqueryable(
    store: Store, run_id: str, channels: Mapping[str, Channel]
) -> dict[str, int]:
    """Unknown items per channel that cannot be queried: only a person can settle them."""
    found: dict[str, int] = {}
    for item in store.queries.items(run_id, [ItemState.UNKNOWN]):
        channel = channels.get(item.channel)
        if channel is not None and not channel.queryable:
            found[item.channel] = found.get(item.channel, 0) + 1
    return found


def complete_if_done(store: Store, run_id: str, lease_version: int) -> None:
    """A paused or halted run whose every item is now sent or failed (or expired) is
    completed, its stop reason cleared. One that still waits, paused for unknown outcomes,
    has that reason brought up to date: the count left, or none once no item is unknown
    (a pause for unknown outcomes is the one stop whose cause a reconcile settles)."""
    run = store.core.get_run(run_id)
    counts = store.queries.counts(run_id)
    if run.state not in (RunState.PAUSED, RunState.HALTED):
        return
    if not counts.unfinished:
        store.ledger.move_run(
            run_id, RunTrigger.COMPLETE, lease_version, stop_reason=None, stop_cause=None
        )
        return
    reason = run.stop_reason
    if reason is not None and run.stop_cause is StopCause.UNKNOWN_LEFT:
        now = unknown_left_reason(counts.unknown) if counts.unknown else None
        if now != reason:
            store.ledger.replace_stop_reason(run_id, lease_version, reason, now)


MARKS: Mapping[str, ItemTrigger] = {
    "sent": ItemTrigger.MARK_SENT,
    "not-sent": ItemTrigger.MARK_NOT_SENT,
    "abandon": ItemTrigger.ABANDON,
}


@dataclass(frozen=True)
class Marked:
    """An item settled by hand: `mark` is one of MARKS; `released`: an abandoned item marked
    not-sent, which stays failed, now known never delivered."""

    run: Run
    item_id: str
    seq: int
    mark: str
    released: bool


def _refuse_inside_the_window(env: Env, store: Store, run: Run, item: Item) -> None:
    """A `not-sent` mark is the operator's own "not found": like a status query's 404, it
    proves nothing while the receiver may still commit a request of the item, until
    `timeout + query_delay` after it left (evidence.not_found_counts_from). Marked then, the
    item would be sent again to a receiver about to commit the first request. The run's own
    channel says how long: built from the run's snapshot (a mark that sends again needs it;
    the run's other channels are not)."""
    attempts = store.queries.attempts(run.run_id, item.seq)
    channel = run_channel(run, env, item.channel)
    try:
        since = not_found_counts_from(channel, attempts)
    finally:
        channel.close()
    if since is not None and clock.now() < since:
        raise Refused(
            f"item {item.item_id} (seq {item.seq}): the receiver of channel {item.channel!r} "
            f"may still commit its last request until {clock.local(clock.iso(since))} (the "
            "channel's timeout plus query_delay after the request left), so nothing seen there "
            "before then shows that it was not sent. Refused: look again after that time, then "
            "mark it not-sent, or sent if the receiver holds it."
        )


def decide_by_hand(
    env: Env, store: Store, run: Run, item_ref: str, mark: str, evidence: str, lease_version: int
) -> Marked:
    """Record the operator's `mark` of one unknown item (or of an abandoned one, marked
    not-sent), with its evidence: what it was marked, and the run as it stands once the mark
    is recorded (not `run`, read before an interactive question: a cancel asked for since is
    what the command must word), for the command to word."""
    # By the row's id only: a number that is no id is never taken for the item at that
    # position, another recipient (an id from another run, a typo, marked not-sent, would
    # send that one again).
    item = store.queries.item_by_id(run.run_id, item_ref)
    if item is None:
        raise BadInput(
            f"run {run.run_id} has no item {item_ref!r}: --item takes the row's id."
        ).advise(NextStep.LIST_UNKNOWN, run.run_id)
    abandoned = item.state is ItemState.FAILED and store.queries.abandoned(run.run_id, item.seq)
    if item.state is not ItemState.UNKNOWN and not (abandoned and mark == "not-sent"):
        refused = BadInput(
            f"item {item.item_id} (seq {item.seq}) is {item.state.value}, not unknown: only "
            "unknown items, and abandoned ones (to mark not-sent), are settled by hand.",
        )
        if item.state is ItemState.IN_FLIGHT:
            # Left by a process that is gone (a live one holds the lease this command took):
            # its request may have reached the receiver, which a query by key tells.
            raise refused.advise(NextStep.SETTLE_IN_FLIGHT_FIRST, run.run_id)
        raise refused
    if not evidence.strip():
        raise BadInput("--evidence is required: say what the decision rests on.")
    if mark == "not-sent" and any(
        a.outcome == AttemptOutcome.PARTIAL for a in store.queries.attempts(run.run_id, item.seq)
    ):
        raise Refused(
            f"item {item.item_id} (seq {item.seq}) was delivered to some of channel "
            f"{item.channel!r}'s destinations ({item.last_error}); marking it not-sent would "
            "send it again to all of them, including those that got it. Refused: mark it "
            "`--mark sent --evidence …` (say who did not get it) or `--mark abandon`.",
        )
    if mark == "not-sent":
        _refuse_inside_the_window(env, store, run, item)
    if abandoned:
        store.ledger.release_abandoned(
            run.run_id, item.seq, operator_name(), evidence, lease_version
        )
    else:
        store.ledger.record_decision(
            run.run_id, item.seq, MARKS[mark], operator_name(), evidence, lease_version
        )
    return Marked(store.core.get_run(run.run_id), item.item_id, item.seq, mark, abandoned)
