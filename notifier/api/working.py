"""Working a stored run: its channels as it snapshotted them, its lease, drafting a
--compose run, and the runner that settles and sends until done, stopped or interrupted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from notifier import config as config_module
from notifier.api.env import Env
from notifier.channels import Channel, ChannelConfigError, UnbuildableChannel
from notifier.content import compose
from notifier.content.drafting import compose_key, draft
from notifier.domain import clock
from notifier.domain.errors import BadInput, NeedsAttention, NextStep, NotifierError, Refused
from notifier.domain.records import Run
from notifier.domain.state_machine import RunTrigger
from notifier.engine import crash
from notifier.engine.membership import Lease, LeaseKind, SoleLease, for_sending
from notifier.engine.runner import Runner, RunOptions, RunResult
from notifier.engine.settle_by_query import unknown_waits
from notifier.engine.signals import interrupt_guard
from notifier.observe import NULL_OBSERVER, Observer
from notifier.store import LeaseHeld, Store


def work_run(
    env: Env,
    store: Store,
    run: Run,
    options: RunOptions,
    *,
    advance: Callable[[int], None] = lambda n: None,
    announce: Callable[[], None] = lambda: None,
    observer: Observer = NULL_OBSERVER,
) -> RunResult:
    """Take the run's lease, then settle and send until done, stopped or interrupted.
    `announce` runs once the lease is held: nothing says "resuming" before it is.
    `observer` is told what happens (--metrics-port, --log-format json)."""
    try:
        return _work(env, store, run, options, advance, announce, observer)
    except NotifierError as exc:
        if exc.then is NextStep.RESUME and exc.then_run is None:
            # The run it goes on with, named, wherever the failure came (taking or letting
            # go of the lease too): a plain `resume` takes the newest unfinished run, which
            # may be another.
            exc.advise(NextStep.RESUME, run.run_id)
        raise


def _work(
    env: Env,
    store: Store,
    run: Run,
    options: RunOptions,
    advance: Callable[[int], None],
    announce: Callable[[], None],
    observer: Observer,
) -> RunResult:
    """work_run's body: its failures as they come."""
    plan = crash.from_env()
    for note in config_module.snapshot_drift(run.channel_snapshot, env.config):
        env.say(f"note: {note}")
    with (
        run_channels(run, env) as channels,
        # Where the store shares runs, every process that sends holds a worker lease of its
        # own, so more workers (`notifier worker`) can join the run from any machine.
        take_lease(
            store, run, env.config.lease_ttl_s, kind=for_sending(store), sends=True
        ) as lease,
        # A signal asks the same run control the lease tells of a loss: the one holder of
        # whether this process stops (run_control.py).
        interrupt_guard(lease.control, env.say),
    ):
        announce()
        runner = Runner(
            lease.store,  # fenced by the lease this process holds (a worker's own, or the run's)
            # Read once the lease is held: a `cancel` (or another process) may have moved the
            # run since it was read to plan or check it; the runner reads it no more.
            lease.store.core.get_run(run.run_id),
            channels,
            env.config.retry.policy(),
            options,
            lease_version=lease.version,
            control=lease.control,
            crash=plan,
            say=env.say,
            advance=advance,
            lease_valid=lease.surely_valid,
            channel_rates={
                name: definition.get("rate") for name, definition in run.channel_snapshot.items()
            },
            observer=observer,
        )
        result = runner.run()
        if result.counts.unknown:
            # Unknown items that only wait for their window: advised to a plain reconcile
            # then, not to a manual mark (marked not sent, they could be sent twice).
            later, marks_from = unknown_waits(lease.store, run.run_id, channels)
            result = replace(result, settle_later=later, marks_from=marks_from)
        return observer.ended(result)


@contextmanager
def run_channels(
    run: Run, env: Env, *, tolerate_broken: bool = False
) -> Iterator[dict[str, Channel]]:
    """The channels as the run snapshotted them (never as the file says now), closed after.
    With `tolerate_broken` (cancel), a channel that cannot be built (a secret no longer in
    the environment, a definition an older version accepted) stands in as one that can be
    neither sent to nor asked: its in-flight items become unknown instead of blocking."""
    channels: dict[str, Channel] = {}
    for name in run.channel_snapshot:
        try:
            channels[name] = env.build(name, run.channel_snapshot[name], env.base_dir)
        except ChannelConfigError as exc:
            if not tolerate_broken:
                for built in channels.values():
                    built.close()
                raise _unbuildable(run, exc) from exc
            channels[name] = UnbuildableChannel(name, str(exc))
    try:
        yield channels
    finally:
        for channel in channels.values():
            channel.close()


def run_channel(run: Run, env: Env, name: str) -> Channel:
    """The run's channel `name` as the run snapshotted it, for the caller to close; BadInput
    naming the run if it cannot be built any more."""
    try:
        return env.build(name, run.channel_snapshot[name], env.base_dir)
    except ChannelConfigError as exc:
        raise _unbuildable(run, exc) from exc


def _unbuildable(run: Run, exc: ChannelConfigError) -> BadInput:
    return BadInput(f"run {run.run_id}: {exc}")


@contextmanager
def take_lease(
    store: Store, run: Run, ttl_s: float, *, kind: LeaseKind = SoleLease, sends: bool = False
) -> Iterator[Lease]:
    """The run's lease for this process. `sends`: a process that would send (or draft) the
    run, for which a cancel under way means it has nothing left to do; any other command
    (a reconcile, a mark by hand, a redraft) is refused while another process holds the
    run, whatever it is doing, and recorded nothing."""
    try:
        lease = kind(store, run.run_id, ttl_s)
    except LeaseHeld as held:
        cancelling = store.core.get_run(run.run_id).cancel_requested_at is not None
        holder = (
            f"pid {held.owner.get('pid')} on {held.owner.get('host')} (lease until "
            f"{clock.local(held.expires_at) if held.expires_at else 'it stops'}"
        )
        if not sends:
            raise Refused(
                f"run {run.run_id} is held by another process, {holder}"
                f"{'; a cancel of the run is under way' if cancelling else ''}), so this one "
                "did nothing: nothing was recorded."
            ).advise(NextStep.AGAIN_ONCE_HOLDER_STOPS, run.run_id) from held
        if cancelling:
            # A `cancel` holds the run for a moment while it closes it.
            raise NeedsAttention(
                f"run {run.run_id} was cancelled (by pid {held.owner.get('pid')}) before this "
                "process could start sending; nothing was sent by it.",
            ).advise(NextStep.REPORT, run.run_id) from held
        raise Refused(
            f"run {run.run_id} is being worked by another process, {holder}), so this one "
            "did nothing.",
        ).advise(NextStep.FOLLOW_HOLDER, run.run_id) from held
    with lease:
        yield lease


def draft_run(env: Env, store: Store, run: Run) -> Run:
    """For a --compose run not frozen yet: draft every row without a draft, then compute and
    store the intents (and, with --require-approval, wait for approval). NeedsAttention (3) when
    drafting cannot finish now; what was drafted stays stored."""
    if not compose.unfrozen(run):
        return run
    with take_lease(store, run, env.config.lease_ttl_s, sends=True) as lease:
        # What the rows are drafted from (the brief, the columns shown to the model, the
        # sources) is what was chained, before any of it is sent to the Messages API.
        compose.refuse_if_altered(store, run, store.drafts.drafts(run.run_id))
        progress = draft(store, run, compose_key(), env.say, lease)
    done = f"{progress.drafted} drafted, {progress.failed} failed, {progress.pending} to draft"
    if progress.stopped is not None:
        stopped = NeedsAttention(f"run {run.run_id}: {progress.stopped} ({done}).")
        step = progress.stopped.then  # the stop's next step, about this run
        raise stopped if step is None else stopped.advise(step, run.run_id)
    if progress.pending:
        why = progress.deferred.value if progress.deferred else "gave no draft"
        raise NeedsAttention(
            f"run {run.run_id}: the Messages API {why} ({done}); the drafts made are stored.",
        ).advise(NextStep.RESUME_LATER_TO_DRAFT, run.run_id)
    then = RunTrigger.REQUEST_APPROVAL if run.options.get("require_approval") else None
    compose.freeze(store, run.run_id, env.config, then)
    return store.core.get_run(run.run_id)
