"""What each command does, between parsing (cli.py) and the layers below. No SQL, no
rendering: this module opens the store, picks the run (env.py's steps, shared with the
read-only commands), takes the lease and runs the work."""

from __future__ import annotations

import os
import pwd
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from . import approval, clock, compose, crash, unsubscribe
from . import config as config_module
from .batch import BatchError, BatchRow, Problems, read_batch, stream_batch
from .channels import Channel, ChannelConfigError, ErrorKind, UnbuildableChannel, build_channel
from .env import Env, open_store, pick_run
from .errors import BadInput, NeedsAttention, Refused
from .intent import CONTRACT_VERSION, new_key_nonce
from .lease import Lease, LeaseKind, SoleLease, for_sending, live_holder
from .plan import RUN_ID_PATTERN, Plan, make_plan, new_run_id
from .reconcile import settle, settle_doubts
from .records import Counts, Run
from .runner import Runner, RunOptions, RunResult
from .signals import Interruption, interrupt_guard
from .state_machine import FINISHED_RUN_STATES, ItemState, ItemTrigger, RunState, RunTrigger
from .store import (
    LeaseHeld,
    LostRace,
    NoDatabase,
    PlanRefused,
    PlanStage,
    Prior,
    RunExists,
    Store,
)
from .store.history import CHANGED, DELIVERED, OPEN, RETRIED, UNSETTLED
from .template import Template, render_stream

# ---------------------------------------------------------------------- send / resume


@dataclass(frozen=True)
class DryRun:
    plan: Plan
    prior: Prior


def plan_batch(
    env: Env,
    batch: Path,
    *,
    channel: str | None,
    run_id: str | None,
    template: Template | None = None,
    not_after: datetime | None = None,
) -> Plan:
    """Validate the whole file, render it, and compute every intent, streaming: rows are
    read, rendered and turned into intents one by one into the plan's scratch stage, so
    memory does not grow with the batch. Nothing is stored in the database here; BatchError
    (listing every bad line) once the file has been read to its end if any row is bad."""
    check_send_options(env, channel=channel, run_id=run_id)
    problems = Problems()
    stage = PlanStage()
    try:
        rows = stream_batch(
            batch,
            env.config.channel_types(),
            channel or config_module.DEFAULT_CHANNEL,
            problems,
            stage,
            not_after,
            unsubscribe.required(env.config.channels),
        )
        if template is not None:
            rows = render_stream(template, rows, problems)
        plan = make_plan(rows, env.config, run_id or new_run_id(), stage=stage, problems=problems)
    except BaseException:
        stage.close()
        raise
    if problems:
        plan.close()
        raise BatchError(batch, problems)
    return plan


def check_send_options(env: Env, *, channel: str | None, run_id: str | None) -> None:
    types = env.config.channel_types()
    if channel is not None and channel not in types:
        known = ", ".join(sorted(types))
        raise BadInput(f"--channel {channel!r} is not defined; known channels: {known}.")
    if run_id is not None and not RUN_ID_PATTERN.match(run_id):
        raise BadInput(f"--run-id {run_id!r}: use 1-64 letters, digits, '.', '_' or '-'.")


def read_rows(
    env: Env,
    batch: Path,
    *,
    channel: str | None,
    run_id: str | None,
    not_after: datetime | None = None,
) -> list[BatchRow]:
    """The validated rows of `batch` as a list (BatchError naming every bad line): for
    --compose, which holds its rows anyway (see compose.py)."""
    check_send_options(env, channel=channel, run_id=run_id)
    types = env.config.channel_types()
    required = unsubscribe.required(env.config.channels)
    return read_batch(batch, types, channel or config_module.DEFAULT_CHANNEL, not_after, required)


def dry_run(env: Env, plan: Plan) -> DryRun:
    """What `send` would plan, compared with the earlier runs of the database as `send`
    compares it (nothing is written)."""
    prior = Prior(plan.count)
    if env.may_hold_runs():
        store = open_store(env, readonly=True)
        try:
            prior = store.compare_plan(plan.items)
        finally:
            store.close()
    return DryRun(plan, prior)


def run_stored(env: Env, run_id: str) -> bool | None:
    """Whether run `run_id` is in the database (None: the database cannot say right now),
    for a command interrupted while it was storing that run."""
    try:
        if not env.may_hold_runs():
            return False
        store = open_store(env, readonly=True)
    except NoDatabase:
        return False
    except Exception:
        return None
    try:
        store.get_run(run_id)
    except KeyError:
        return False
    except Exception:
        return None
    finally:
        store.close()
    return True


def check_channels(env: Env, names: Iterable[str]) -> None:
    """Build the channels a run will use, as they stand now, and close them: a secret or a
    URL list named by an environment variable (`secret_env`, `urls_env`, `password_env`) that
    is missing or unusable is found before anything is stored, so exit 2 keeps meaning that
    nothing changed. The messages name the variable, never its value."""
    for name in sorted(set(names)):
        try:
            channel = build_channel(name, dict(env.config.channels[name]), env.base_dir)
        except ChannelConfigError as exc:
            raise BadInput(
                f"{exc} Nothing was stored and nothing was sent; set it and run the same "
                "command again."
            ) from exc
        channel.close()


@dataclass(frozen=True)
class Stored:
    """A stored plan: its store (None when nothing was left to send, and nothing stored),
    and how the file's rows compared with earlier runs (None with --new-run)."""

    store: Store | None
    prior: Prior | None


def store_plan(
    env: Env,
    plan: Plan,
    batch: Path,
    options: Mapping[str, object],
    new_run: bool,
    *,
    resend_changed: bool = False,
    then: RunTrigger | None = None,
) -> Stored:
    """Store what is left of the plan once earlier runs are accounted for (history.py: one
    decision with the insert, inside the store's write transaction), or with `new_run`
    every row. The plan's scratch stage is discarded either way."""
    try:
        store = open_store(env, create=True)
    except BaseException:
        plan.close()
        raise
    try:
        prior = store.create_run(
            plan.run_row(str(batch), dict(options)),
            plan.items,
            new_run=new_run,
            resend_changed=resend_changed,
            then=then,
        )
    except PlanRefused as refused:
        try:
            holder = _open_run_holder(store, refused.prior)
        finally:
            store.close()
        raise BadInput(refusal_message(batch, refused.prior, holder)) from None
    except RunExists:
        store.close()
        raise BadInput(f"run {plan.run_id!r} already exists: choose another --run-id.") from None
    except BaseException:
        store.close()
        raise
    finally:
        plan.close()
    if prior is not None and not prior.left:
        store.close()
        return Stored(None, prior)
    return Stored(store, prior)


def _runs(prior: Prior, verdict: str) -> str:
    """ "run A", or "runs A, B" (oldest first)."""
    runs = prior.runs(verdict)
    return ("run " if len(runs) == 1 else "runs ") + ", ".join(runs)


def _open_run_holder(store: Store, prior: Prior) -> dict[str, Any] | None:
    """Who is working the unfinished run that holds the file's open rows right now (the
    winner of two simultaneous sends, say), if anyone."""
    runs = prior.runs(OPEN)
    return live_holder(store, store.get_run(runs[-1])) if runs else None


def refusal_message(batch: Path, prior: Prior, holder: dict[str, Any] | None = None) -> str:
    """Why nothing was stored, naming the runs and rows, and the command that will work."""
    if prior.count(OPEN):
        runs = prior.runs(OPEN)
        if holder is not None:
            # `resume` would be refused while that process holds the run.
            return (
                f"{batch}: {prior.count(OPEN)} row(s) are being sent right now by run "
                f"{runs[-1]} (pid {holder.get('pid')} on {holder.get('host')}); two runs never "
                f"hold the same row. Nothing was stored. Follow it with `notifier status "
                f"{runs[-1]}`; once it is done, send the file again to send what it did not "
                "deliver."
            )
        return (
            f"{batch}: {prior.count(OPEN)} row(s) are still open (pending, in flight or "
            f"unknown) in unfinished {_runs(prior, OPEN)}; two runs never hold the same "
            f"row. Nothing was stored. Continue that run with `notifier resume {runs[-1]}` "
            f"(or stop it with `notifier cancel {runs[-1]}`), then send the file again to "
            "send what it did not deliver."
        )
    if prior.count(UNSETTLED):
        runs = prior.runs(UNSETTLED)
        return (
            f"{batch}: {prior.count(UNSETTLED)} row(s) may have been delivered by finished "
            f"{_runs(prior, UNSETTLED)} (their outcome is unknown). Nothing was stored. "
            f"Settle them with `notifier reconcile --manual {runs[-1]}`, then send the file "
            "again."
        )
    n = prior.count(CHANGED)
    listed = ", ".join(f"{item_id} (row {seq})" for seq, item_id in prior.changed_rows)
    more = f" and {n - len(prior.changed_rows)} more" if n > len(prior.changed_rows) else ""
    return (
        f"{batch}: {n} row(s) were delivered before by {_runs(prior, CHANGED)} with "
        f"different content: {listed}{more}. Nothing was stored. If the change is meant to "
        "reach them, send the file again with --resend-changed (each goes out again as a new "
        "notification); otherwise restore those rows as they were."
    )


def prior_summary(prior: Prior) -> list[str]:
    """The lines `send` prints about earlier runs: what was left out, and what is retried."""
    lines = []
    if prior.count(DELIVERED):
        lines.append(
            f"{prior.count(DELIVERED)} row(s) already delivered with the same content by "
            f"{_runs(prior, DELIVERED)}: not sent again."
        )
    if prior.count(RETRIED):
        lines.append(
            f"{prior.count(RETRIED)} row(s) never delivered by earlier "
            f"{_runs(prior, RETRIED)} (failed, expired, cancelled or not sent): sent again."
        )
    if prior.count(CHANGED):
        lines.append(
            f"{prior.count(CHANGED)} row(s) changed since {_runs(prior, CHANGED)} "
            "delivered them: sent again as new notifications (--resend-changed)."
        )
    return lines


def work_run(
    env: Env,
    store: Store,
    run: Run,
    options: RunOptions,
    *,
    advance: Callable[[int], None] = lambda n: None,
    announce: Callable[[], None] = lambda: None,
) -> RunResult:
    """Take the run's lease, then settle and send until done, stopped or interrupted.
    `announce` runs once the lease is held: nothing says "resuming" before it is."""
    plan = crash.from_env()
    for note in config_module.snapshot_drift(run.channel_snapshot, env.config):
        env.say(f"note: {note}")
    interrupted = Interruption()
    with (
        run_channels(run, env.base_dir) as channels,
        # Where the store shares runs, every process that sends holds a worker lease of its
        # own, so more workers (`notifier worker`) can join the run from any machine.
        take_lease(store, run, env.config.lease_ttl_s, kind=for_sending(store)) as lease,
        interrupt_guard(interrupted, env.say),
    ):
        announce()
        runner = Runner(
            store,
            run.run_id,
            channels,
            env.config.retry.policy(),
            options,
            lease_version=lease.version,
            lease_lost=lease.lost,
            interrupted=interrupted,
            crash=plan,
            say=env.say,
            advance=advance,
            lease_valid=lease.surely_valid,
            channel_rates={
                name: definition.get("rate") for name, definition in run.channel_snapshot.items()
            },
        )
        return runner.run()


@contextmanager
def run_channels(
    run: Run, base_dir: Path, *, tolerate_broken: bool = False
) -> Iterator[dict[str, Channel]]:
    """The channels as the run snapshotted them (never as the file says now), closed after.
    With `tolerate_broken` (cancel), a channel that cannot be built (a secret no longer in
    the environment, a definition an older version accepted) stands in as one that can be
    neither sent to nor asked: its in-flight items become unknown instead of blocking."""
    channels: dict[str, Channel] = {}
    for name, definition in run.channel_snapshot.items():
        try:
            channels[name] = build_channel(name, definition, base_dir)
        except ChannelConfigError as exc:
            if not tolerate_broken:
                for built in channels.values():
                    built.close()
                raise BadInput(f"run {run.run_id}: {exc}") from exc
            channels[name] = UnbuildableChannel(name, str(exc))
    try:
        yield channels
    finally:
        for channel in channels.values():
            channel.close()


@contextmanager
def take_lease(
    store: Store, run: Run, ttl_s: float, *, kind: LeaseKind = SoleLease
) -> Iterator[Lease]:
    try:
        lease = kind(store, run.run_id, ttl_s)
    except LeaseHeld as held:
        if store.get_run(run.run_id).cancel_requested_at:
            # A `cancel` holds the run for a moment while it closes it.
            raise NeedsAttention(
                f"run {run.run_id} was cancelled (by pid {held.owner.get('pid')}) before this "
                f"process could start sending; nothing was sent by it. `notifier report "
                f"{run.run_id}` shows the run.",
            ) from held
        raise Refused(
            f"run {run.run_id} is being worked by another process, pid "
            f"{held.owner.get('pid')} on {held.owner.get('host')} (lease until "
            f"{clock.local(held.expires_at) if held.expires_at else 'it stops'}), so this one "
            "did nothing. Follow it with `notifier status "
            f"{run.run_id}`; once it has finished or stopped, `notifier resume {run.run_id}` "
            f"continues whatever it left. To stop it now: `notifier cancel {run.run_id}`.",
        ) from held
    with lease:
        yield lease


# ---------------------------------------------------------------------- drafts (--compose)


def store_drafting_run(
    env: Env, rows: list[BatchRow], batch: Path, options: Mapping[str, object], run_id: str
) -> Store:
    """The run and one pending draft per row, before any request: a crash from here on is
    resumed by drafting only the rows without a draft."""
    run = {
        "run_id": run_id,
        "state": RunState.PLANNED.value,
        "created_at": clock.now_iso(),
        "batch_path": str(batch),
        "channel_snapshot": env.config.snapshot({row.channel for row in rows}),
        "options": dict(options),
        "contract_version": CONTRACT_VERSION,
        # Made now, used when the drafts are frozen into intents (perhaps by a later resume).
        "key_nonce": new_key_nonce(),
    }
    store = open_store(env, create=True)
    try:
        with suppress(KeyError):
            store.get_run(run_id)
            raise BadInput(f"run {run_id!r} already exists: choose another --run-id.")
        store.create_drafting_run(
            run, [(row.seq, row.line, compose.row_to_source(row)) for row in rows]
        )
    except BaseException:
        store.close()
        raise
    return store


def compose_key() -> str:
    try:
        return compose.api_key()
    except compose.ComposeUsage as exc:
        raise BadInput(str(exc)) from exc


def draft_run(env: Env, store: Store, run: Run) -> Run:
    """For a --compose run not frozen yet: draft every row without a draft, then compute and
    store the intents (and, with --require-approval, wait for approval). NeedsAttention (3) when
    drafting cannot finish now; what was drafted stays stored."""
    if not compose.unfrozen(run):
        return run
    from . import drafting  # noqa: PLC0415 (the SDK loads only when drafting)

    with take_lease(store, run, env.config.lease_ttl_s) as lease:
        progress = drafting.draft(store, run, compose_key(), env.say, lease)
    done = f"{progress.drafted} drafted, {progress.failed} failed, {progress.pending} to draft"
    if progress.stopped is not None:
        raise NeedsAttention(f"run {run.run_id}: {progress.stopped} ({done}.)")
    if progress.pending:
        raise NeedsAttention(
            f"run {run.run_id}: the Messages API stayed busy ({done}); the drafts made are "
            f"stored. Run `notifier resume {run.run_id}` later to draft the rest.",
        )
    then = RunTrigger.REQUEST_APPROVAL if run.options.get("require_approval") else None
    compose.freeze(store, run.run_id, env.config, then)
    return store.get_run(run.run_id)


# ---------------------------------------------------------------------- approval


def check_can_send(store: Store, run: Run) -> None:
    """Exit 4, before anything is sent, for a run whose required approval is missing,
    expired, or no longer matches the stored intents."""
    try:
        approval.check_can_send(store, run)
    except approval.ApprovalRefused as exc:
        raise Refused(str(exc)) from exc


def approve(
    env: Env, run_id: str | None, fingerprint: str, expires_in: str
) -> tuple[Run, approval.Approval]:
    """Approve run `run_id`, or without one the run waiting for approval whose fingerprint
    `fingerprint` is (never checked against any other run)."""
    try:
        span = approval.parse_duration(expires_in)
    except approval.ApprovalUsage as exc:
        raise BadInput(str(exc)) from exc
    store = open_store(env)
    try:
        run = (
            pick_run(store, run_id)
            if run_id is not None
            else _run_with_fingerprint(store, fingerprint)
        )
        try:
            return run, approval.approve(store, run, fingerprint, span, operator_name())
        except approval.ApprovalUsage as exc:
            raise BadInput(str(exc)) from exc
        except approval.ApprovalRefused as exc:
            raise Refused(str(exc)) from exc
        except LostRace as exc:
            raise Refused(
                f"run {run.run_id} changed while it was being approved ({exc}); nothing was "
                "approved. Review it again with `notifier status`, then approve.",
            ) from exc
    finally:
        store.close()


def _run_with_fingerprint(store: Store, fingerprint: str) -> Run:
    """The one unfinished run needing approval that was planned with `fingerprint`: exit 4
    when there is none (the refusal names no fingerprint), exit 2 when several share it."""
    found = [
        run
        for run in store.runs_with_fingerprint(fingerprint.strip())
        if run.state not in FINISHED_RUN_STATES and approval.requires_approval(run)
    ]
    if not found:
        raise Refused(
            f"no run waiting for approval has fingerprint {approval.abridged(fingerprint)!r}: "
            "it was mistyped, copied from a run that is closed, or the run's notifications "
            "changed since that preview. Nothing was approved. `notifier runs` lists the runs; "
            "`notifier preview RUN` shows a run's notifications with its fingerprint on the "
            "last line, and `notifier approve RUN --fingerprint sha256:…` approves that run."
        )
    if len(found) > 1:
        names = ", ".join(run.run_id for run in found)
        raise BadInput(
            f"runs {names} were planned with the same notifications, so the fingerprint alone "
            "does not say which one to approve; nothing was approved. Name it: `notifier "
            f"approve {found[0].run_id} --fingerprint sha256:…`."
        )
    return found[0]


def reject(env: Env, run_id: str | None, reason: str) -> tuple[Run, str]:
    """Close a run awaiting approval, nothing sent, with who rejected it, when and why in
    its audit trail. Without RUN_ID: the newest unfinished run."""
    if not reason.strip():
        raise BadInput("--reason is empty: say why the run is rejected (it is kept in its audit).")
    operator = operator_name()
    store = open_store(env)
    try:
        run = pick_run(store, run_id, active_only=run_id is None)
        if run.state is not RunState.AWAITING_APPROVAL:
            advice = (
                "there is nothing to reject"
                if run.state in FINISHED_RUN_STATES
                else f"`notifier cancel {run.run_id}` stops it instead"
            )
            raise BadInput(
                f"run {run.run_id} is {run.state.value}, not awaiting approval, so it cannot be "
                f"rejected; {advice}."
            )
        store.reject_run(run.run_id, operator, reason.strip())
        return store.get_run(run.run_id), operator
    finally:
        store.close()


# ---------------------------------------------------------------------- cancel


@dataclass(frozen=True)
class CancelResult:
    run: Run
    confirmed: bool  # no request of the run can start any more
    message: str
    counts: Counts


def cancel(env: Env, run_id: str | None, wait_s: float) -> CancelResult:
    """Returns once no request of the run can start any more (the worker moved the run to
    cancelled, or there was no worker and this process did), or says that the worker did not
    confirm in time (exit 3). A run that finished meanwhile is reported as it is."""
    store = open_store(env)
    try:
        run = pick_run(store, run_id, active_only=True)
        if run.state in FINISHED_RUN_STATES or not store.request_cancel(run.run_id):
            return _already_finished(store, store.get_run(run.run_id))
        deadline = time.monotonic() + wait_s
        while True:
            run = _wait_for_worker(store, run.run_id, deadline)
            if run.state in FINISHED_RUN_STATES:
                break
            holder = live_holder(store, run)
            if holder is not None:
                return CancelResult(
                    run,
                    False,
                    f"run {run.run_id}: cancel recorded, but the worker (pid "
                    f"{holder.get('pid')} on {holder.get('host')}) did not "
                    f"confirm within {wait_s:g}s, so a request may still start until it does. "
                    f"Check with `notifier status {run.run_id}`, or wait longer with "
                    f"`notifier cancel {run.run_id} --wait 120`.",
                    store.counts(run.run_id),
                )
            try:
                run = _cancel_without_worker(env, store, run)
                break
            except LeaseHeld:
                # A `send` or `resume` took the lease between our look and our take (e.g. a
                # send that had just planned the run): it sees the flag; wait for it instead.
                continue
        if run.state is not RunState.CANCELLED:
            return _already_finished(store, run)
        counts = store.counts(run.run_id)
        message = f"run {run.run_id} cancelled."
        if counts.unknown:
            message += (
                f" {counts.unknown} item(s) may have been delivered and are unknown: settle "
                f"them with `notifier reconcile --manual {run.run_id}`."
            )
        return CancelResult(run, True, message, counts)
    finally:
        store.close()


def _already_finished(store: Store, run: Run) -> CancelResult:
    return CancelResult(
        run,
        True,
        f"run {run.run_id} is already {run.state.value}; nothing to cancel.",
        store.counts(run.run_id),
    )


def _wait_for_worker(store: Store, run_id: str, deadline: float) -> Run:
    while True:
        run = store.get_run(run_id)
        live = live_holder(store, run) is not None
        if run.state in FINISHED_RUN_STATES or not live or time.monotonic() >= deadline:
            return run
        time.sleep(0.05)


def _cancel_without_worker(env: Env, store: Store, run: Run) -> Run:
    """No live worker: settle what it left in flight (and every maybe-delivered item waiting
    to retry) by query, then mark the run cancelled. Raises LeaseHeld if a worker took the
    run meanwhile."""
    with run_channels(run, env.base_dir, tolerate_broken=True) as channels:
        lease = SoleLease(store, run.run_id, env.config.lease_ttl_s)
        with lease:
            if store.get_run(run.run_id).state in FINISHED_RUN_STATES:
                return store.get_run(run.run_id)  # completed by a worker before our lease
            settle(store, run.run_id, channels, lease.version, include_unknown=True, say=env.say)
            settle_doubts(store, run.run_id, channels, lease.version, say=env.say)
            store.move_run(run.run_id, RunTrigger.CANCEL, lease.version, stop_reason=None)
    return store.get_run(run.run_id)


# ---------------------------------------------------------------------- reconcile


def reconcile_by_query(env: Env, run_id: str | None) -> tuple[Run, Counts]:
    store = open_store(env)
    try:
        run = pick_run(store, run_id)
        with (
            run_channels(run, env.base_dir) as channels,
            take_lease(store, run, env.config.lease_ttl_s) as lease,
        ):
            settlements = settle(
                store, run.run_id, channels, lease.version, include_unknown=True, say=env.say
            )
            blind = _unknown_on_unqueryable(store, run.run_id, channels)
            if not settlements and not blind:
                env.say("nothing to settle: no item is in flight or unknown.")
            if blind:
                names = ", ".join(sorted(blind))
                env.say(
                    f"{sum(blind.values())} unknown item(s) on channel(s) {names}, which "
                    "cannot be asked whether a message arrived (SMTP and Apprise answer no "
                    "such query): there is nothing `notifier reconcile` can settle for them by "
                    "query. Check the recipients' side, then settle each by hand with "
                    f"`notifier reconcile --manual {run.run_id}`."
                )
            complete_if_done(store, run.run_id, lease.version)
        return store.get_run(run.run_id), store.counts(run.run_id)
    finally:
        store.close()


def _unknown_on_unqueryable(
    store: Store, run_id: str, channels: Mapping[str, Channel]
) -> dict[str, int]:
    """Unknown items per channel that cannot be queried: only a person can settle them."""
    found: dict[str, int] = {}
    for item in store.items(run_id, [ItemState.UNKNOWN]):
        channel = channels.get(item.channel)
        if channel is not None and not channel.queryable:
            found[item.channel] = found.get(item.channel, 0) + 1
    return found


# How the runner words a pause for unknown outcomes (runner.py): the one stop reason whose
# cause a reconcile settles, item by item.
_UNKNOWN_REASON = re.compile(r"\d+ item\(s\) with unknown outcome")


def complete_if_done(store: Store, run_id: str, lease_version: int) -> None:
    """A paused or halted run whose every item is now sent or failed (or expired) is
    completed, its stop reason cleared. One that still waits, paused for unknown outcomes,
    has that reason brought up to date: the count left, or none once no item is unknown."""
    run = store.get_run(run_id)
    counts = store.counts(run_id)
    if run.state not in (RunState.PAUSED, RunState.HALTED):
        return
    if not counts.unfinished:
        store.move_run(run_id, RunTrigger.COMPLETE, lease_version, stop_reason=None)
        return
    reason = run.stop_reason
    if reason is not None and _UNKNOWN_REASON.fullmatch(reason):
        now = f"{counts.unknown} item(s) with unknown outcome" if counts.unknown else None
        if now != reason:
            store.replace_stop_reason(run_id, lease_version, reason, now)


MARKS: Mapping[str, ItemTrigger] = {
    "sent": ItemTrigger.MARK_SENT,
    "not-sent": ItemTrigger.MARK_NOT_SENT,
    "abandon": ItemTrigger.ABANDON,
}


def operator_name() -> str:
    """Who is at the keyboard, for the audit: $USER, else the login name of this process's
    uid (cron, containers and `sudo -i` often leave USER unset), else the uid itself."""
    user = os.environ.get("USER")
    if user:
        return user
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry (an arbitrary container uid)
        return f"uid {uid}"


def decide(
    env: Env, store: Store, run: Run, item_ref: str, mark: str, evidence: str, lease_version: int
) -> str:
    item = store.item_by_id(run.run_id, item_ref)
    if item is None and item_ref.isdigit():
        with suppress(KeyError):
            item = store.item(run.run_id, int(item_ref))
    if item is None:
        raise BadInput(f"run {run.run_id} has no item {item_ref!r}.")
    if item.state is not ItemState.UNKNOWN:
        raise BadInput(
            f"item {item.item_id} (seq {item.seq}) is {item.state.value}, not unknown: only "
            "unknown items are settled by hand.",
        )
    if not evidence.strip():
        raise BadInput("--evidence is required: say what the decision rests on.")
    if mark == "not-sent" and any(
        a.outcome == ErrorKind.PARTIAL.value for a in store.attempts(run.run_id, item.seq)
    ):
        raise Refused(
            f"item {item.item_id} (seq {item.seq}) was delivered to some of channel "
            f"{item.channel!r}'s destinations ({item.last_error}); marking it not-sent would "
            "send it again to all of them, including those that got it. Refused: mark it "
            "`--mark sent --evidence …` (say who did not get it) or `--mark abandon`.",
        )
    store.decide(run.run_id, item.seq, MARKS[mark], operator_name(), evidence, lease_version)
    after = {
        "sent": "sent",
        "not-sent": (
            "pending (it will be sent with the same key on resume)"
            if run.state not in FINISHED_RUN_STATES
            else f"pending; run {run.run_id} is {run.state.value}, so it will not send it. "
            f"Send the same file again (`notifier send {run.batch_path}`) to send it: only rows "
            "never delivered are sent"
        ),
        "abandon": "failed",
    }[mark]
    return f"item {item.item_id} (seq {item.seq}) → {after}; evidence recorded."
