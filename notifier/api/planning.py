"""`send`'s first half: validate and plan a batch (plan.py computes the intents), compare
it with the runs before, and store it, or say why not. Nothing is sent from here."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from notifier import config as config_module
from notifier.api.env import Env, open_store
from notifier.channels import ChannelConfigError
from notifier.content import compose, unsubscribe
from notifier.content.batch_csv import BatchError, BatchRow, Problems, read_batch, stream_batch
from notifier.content.plan import RUN_ID_PATTERN, Plan, make_plan, new_run_id, source_digest
from notifier.content.schedule import Schedule, schedule_stream
from notifier.content.template import Template, render_stream
from notifier.domain import clock
from notifier.domain.errors import BadInput, NextStep, NotifierError
from notifier.domain.intent import CONTRACT_VERSION, new_key_nonce
from notifier.domain.state_machine import ItemState, RunState, RunTrigger
from notifier.domain.suppression import address_keys
from notifier.engine import crash
from notifier.engine.membership import live_holder
from notifier.store import (
    NoDatabase,
    PlanRefused,
    PlanStage,
    Prior,
    ReadRaced,
    RunExists,
    Store,
)
from notifier.store.history import CHANGED, OPEN, SAME_CONTENT, UNSETTLED


@dataclass(frozen=True)
class DryRun:
    plan: Plan
    prior: Prior
    open_run: OpenRun | None = None  # the unfinished run holding the file's open rows


@dataclass(frozen=True)
class OpenRun:
    """The unfinished run that holds a file's open rows, as a refusal's advice needs it: who
    works it right now, if anyone (`resume` is refused while they do), and whether it
    awaits approval (`resume` is refused until it is approved)."""

    holder: dict[str, Any] | None
    awaiting_approval: bool
    # Its cancel was asked for and not finished: it sends nothing more, whoever resumes it.
    being_cancelled: bool = False


def plan_batch(
    env: Env,
    batch: Path,
    *,
    channel: str | None,
    run_id: str | None,
    template: Template | None = None,
    not_after: datetime | None = None,
    schedule: Schedule | None = None,
    allow_duplicates: bool = False,
    rehearsal: crash.CrashPlan | None = None,
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
        if schedule is not None:
            rows = schedule_stream(rows, schedule, problems)
        if template is not None:
            rows = render_stream(template, rows, problems)
        plan = make_plan(
            rows,
            env.config,
            run_id or new_run_id(),
            stage=stage,
            problems=problems,
            refuse_identical=not allow_duplicates,
        )
    except BaseException:
        stage.close()
        raise
    if problems:
        plan.close()
        raise BatchError(batch, problems)
    if rehearsal is not None:
        try:
            rehearsal.check_fires(plan.count, str(batch))
        except crash.CrashSpecError:
            plan.close()
            raise
    return plan


def stored_options(pace: dict[str, object], **shaping: object) -> dict[str, object]:
    """The options kept with the run: its pace, so `resume` sends the same way unless told
    otherwise, and what shaped it (those given), which every command the tool suggests
    repeats (outcome.send_again)."""
    return {**pace, **{key: value for key, value in shaping.items() if value is not None}}


def check_send_options(env: Env, *, channel: str | None, run_id: str | None) -> None:
    types = env.config.channel_types()
    if channel is not None and channel not in types:
        known = ", ".join(sorted(types))
        raise BadInput(f"--channel {channel!r} is not defined; known channels: {known}.")
    if run_id is not None and not RUN_ID_PATTERN.match(run_id):
        raise BadInput(
            f"--run-id {run_id!r}: use 1-64 letters, digits, '.', '_' or '-', and start with "
            "a letter or a digit; nothing was stored."
        )


def read_rows(
    env: Env,
    batch: Path,
    *,
    channel: str | None,
    run_id: str | None,
    not_after: datetime | None = None,
    allow_duplicates: bool = False,
) -> list[BatchRow]:
    """The validated rows of `batch` as a list (BatchError naming every bad line): for
    --compose, which holds its rows anyway (see compose.py). A row repeating an earlier
    line's identity is refused as a plain send refuses it (unless `allow_duplicates`): each
    copy would be drafted and sent, to the same recipient."""
    check_send_options(env, channel=channel, run_id=run_id)
    types = env.config.channel_types()
    required = unsubscribe.required(env.config.channels)
    rows = read_batch(batch, types, channel or config_module.DEFAULT_CHANNEL, not_after, required)
    if not allow_duplicates:
        problems = Problems()
        make_plan(
            rows, env.config, run_id or new_run_id(), problems=problems, refuse_identical=True
        ).close()
        if problems:
            raise BatchError(batch, problems)
    return rows


def dry_run(env: Env, plan: Plan) -> DryRun:
    """What `send` would plan, compared with the earlier runs of the database as `send`
    compares it (nothing is written)."""
    prior = Prior(plan.count)
    if env.may_hold_runs():
        try:
            store = open_store(env, readonly=True)
        except NoDatabase:
            return DryRun(plan, prior)  # a server with no notifier schema yet: all is new
        try:
            prior = store.history.compare_plan(plan.items)
            return DryRun(plan, prior, _open_run(store, prior))
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
        store.core.get_run(run_id)
    except KeyError:
        found: bool | None = False
    except Exception:
        found = None
    else:
        found = True
    try:
        store.close()
    except ReadRaced:  # another process wrote under the read: what it read cannot say
        return None
    return found


def check_channels(env: Env, names: Iterable[str]) -> None:
    """Build the channels a run will use, as they stand now, and close them: a secret or a
    URL named by an environment variable (`secret_env`, `urls_env`, `url_env`, ...) that
    is missing or unusable is found before anything is stored, so exit 2 keeps meaning that
    nothing changed. The messages name the variable, never its value."""
    for name in sorted(set(names)):
        try:
            channel = env.build(name, dict(env.config.channels[name]), env.base_dir)
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
    rehearsal: crash.CrashPlan | None = None,
) -> Stored:
    """Store what is left of the plan once earlier runs are accounted for (history.py: one
    decision with the insert, inside the store's write transaction), or with `new_run`
    every row. The plan's scratch stage is discarded either way."""
    try:
        store = open_store(env, create=True)
    except BaseException:
        plan.close()
        raise
    check = None
    if rehearsal is not None:

        def check() -> None:
            # Inside the plan's transaction: a CrashSpecError rolls the whole plan back.
            try:
                state: ItemState | None = store.queries.item(plan.run_id, rehearsal.seq).state
            except KeyError:
                state = None
            rehearsal.check_planned(state, str(batch))

    try:
        prior = store.plans.create_run(
            plan.run_row(shown_path(batch), dict(options)),
            plan.items,
            new_run=new_run,
            resend_changed=resend_changed,
            then=then,
            check=check,
        )
    except PlanRefused as refused:
        try:
            open_run = _open_run(store, refused.prior)
        finally:
            store.close()
        raise refusal(batch, refused.prior, open_run) from None
    except RunExists:
        store.close()
        raise BadInput(f"run {plan.run_id!r} already exists: choose another --run-id.") from None
    except NotifierError as exc:
        store.close()
        if exc.then is NextStep.RESUME:
            # The plan's transaction rolled back whole: no run exists to resume, and a plain
            # `resume` would send whichever older run is unfinished. The same send again.
            exc.advise(NextStep.SEND_AGAIN)
        raise
    except BaseException:
        store.close()
        raise
    finally:
        plan.close()
    if prior is not None and not prior.left:
        store.close()
        return Stored(None, prior)
    return Stored(store, prior)


def runs_named(prior: Prior, verdict: str) -> str:
    """ "run A", or "runs A, B" (oldest first)."""
    runs = prior.runs(verdict)
    return ("run " if len(runs) == 1 else "runs ") + ", ".join(runs)


def _open_run(store: Store, prior: Prior) -> OpenRun | None:
    """The newest unfinished run that holds the file's open rows, if any: who is working it
    right now (the winner of two simultaneous sends, say), and whether it awaits approval."""
    runs = prior.runs(OPEN)
    if not runs:
        return None
    run = store.core.get_run(runs[-1])
    return OpenRun(
        live_holder(store, run),
        run.state is RunState.AWAITING_APPROVAL,
        run.cancel_requested_at is not None,
    )


def refusal(
    batch: Path, prior: Prior, open_run: OpenRun | None = None, *, resend: bool = True
) -> BadInput:
    """Why nothing was stored, naming the runs and rows, with the step that will work
    (`resend`: whether --resend-changed is one; not for a composed file)."""
    if prior.count(OPEN):
        runs = prior.runs(OPEN)
        holder = open_run.holder if open_run is not None else None
        if holder is not None:
            # `resume` would be refused while that process holds the run.
            return BadInput(
                f"{batch}: {prior.count(OPEN)} row(s) are being sent right now by run "
                f"{runs[-1]} (pid {holder.get('pid')} on {holder.get('host')}); two runs never "
                "hold the same row. Nothing was stored."
            ).advise(NextStep.FOLLOW_THEN_SEND_AGAIN, runs[-1])
        # The rows of the newest run alone, then those of the older runs, each named.
        here = prior.by_run[OPEN][runs[-1]]
        older = (
            f" (and {prior.count(OPEN) - here} more in unfinished {', '.join(runs[:-1])})"
            if len(runs) > 1
            else ""
        )
        if open_run is not None and open_run.being_cancelled:
            # Approved and resumed, it is closed as cancelled, sending nothing.
            return BadInput(
                f"{batch}: {here} row(s) are still open in run {runs[-1]}{older}, whose cancel "
                "was asked for and not finished: it sends nothing more. Two runs never hold "
                "the same row. Nothing was stored."
            ).advise(NextStep.CANCEL_THEN_SEND_AGAIN, runs[-1])
        if open_run is not None and open_run.awaiting_approval:
            # `resume` is refused until the run is approved.
            return BadInput(
                f"{batch}: {here} row(s) are still open in run {runs[-1]}{older}, which "
                "awaits approval; two runs never hold the same row. Nothing was stored."
            ).advise(NextStep.APPROVE_OR_REJECT_THEN_SEND_AGAIN, runs[-1])
        return BadInput(
            f"{batch}: {prior.count(OPEN)} row(s) are still open (pending, in flight or "
            f"unknown) in unfinished {runs_named(prior, OPEN)}; two runs never hold the same "
            "row. Nothing was stored."
        ).advise(NextStep.RESUME_OR_CANCEL_THEN_SEND_AGAIN, runs[-1])
    if prior.count(UNSETTLED):
        return BadInput(
            f"{batch}: {prior.count(UNSETTLED)} row(s) may have been delivered by finished "
            f"{runs_named(prior, UNSETTLED)} (their outcome is unknown). Nothing was stored."
        ).advise(
            # Every run named: settling the newest alone leaves the file refused over the
            # older ones' rows.
            NextStep.SETTLE_THEN_SEND_AGAIN,
            runs=prior.runs(UNSETTLED)[::-1],
        )
    return BadInput(" ".join(_held_otherwise(batch, prior, resend)) + " Nothing was stored.")


def _held_otherwise(batch: Path, prior: Prior, resend: bool) -> list[str]:
    """The rows an earlier run delivered as other notifications than this file's: changed
    (the same identity, other content) and same content (named otherwise then: an `id`
    column added or dropped), each kind named, and how each may be sent (`resend`:
    --resend-changed applies)."""
    said = []
    if n := prior.count(CHANGED):
        listed = ", ".join(f"{item_id} (row {seq})" for seq, item_id in prior.changed_rows)
        more = f" and {n - len(prior.changed_rows)} more" if n > len(prior.changed_rows) else ""
        said.append(
            f"{batch}: {n} row(s) were delivered before by {runs_named(prior, CHANGED)} with "
            f"different content: {listed}{more}."
        )
    if n := prior.count(SAME_CONTENT):
        said.append(
            f"{'' if said else f'{batch}: '}{n} row(s) have the channel, recipient and content "
            f"of rows delivered (or abandoned, maybe delivered) by "
            f"{runs_named(prior, SAME_CONTENT)}, or of the rows their texts were composed from, "
            "from a file that named its rows otherwise (an `id` column added since, or "
            "dropped); notifier cannot tell whether they are the same notifications. Sent as "
            "it was then (its `id` column as it was, and with --compose if it was composed), "
            "the delivered rows are left out."
        )
    if resend:
        said.append(
            "If every such row is meant to reach its recipient again, send the file again "
            "with --resend-changed (each goes out again as a new notification); otherwise "
            "restore those rows as they were."
        )
    return said


@dataclass(frozen=True)
class Composing:
    """The rows of a `send --compose` left to draft, and why the others were left out."""

    rows: list[BatchRow]
    prior: Prior
    suppressed: int = 0  # rows whose recipient is on the suppression list


def compare_composed(env: Env, rows: list[BatchRow], batch: Path, run_id: str) -> Composing:
    """The rows of a `send --compose` left to draft, before a token is spent: compared
    with every earlier run by their identities as rows of the file (a drafted text is not
    part of a row's identity), BadInput (exit 2) when a row is open in an unfinished run or
    unsettled in a finished one; rows delivered (or abandoned) before are left out, and so
    are rows whose recipient is suppressed (drafting them would be paid for, never sent)."""
    if not env.may_hold_runs():
        return Composing(rows, Prior(len(rows)))
    plan = make_plan(rows, env.config, run_id)
    try:
        try:
            # Not read-only: a database an earlier version wrote is migrated first, so the
            # rows are compared with the identities this version gives them (m012).
            store = open_store(env)
        except NoDatabase:
            return Composing(rows, Prior(len(rows)))
        try:
            prior, left_out = store.history.compare_composed(plan.items)
            if prior.refused(resend_changed=False):
                raise refusal(batch, prior, _open_run(store, prior), resend=False)
            suppressed = {s.address for s in store.suppressions.suppressions()}
        finally:
            store.close()
    finally:
        plan.close()
    dropped = set(left_out)
    kept = [row for row in rows if row.seq not in dropped]
    drafted = [row for row in kept if suppressed.isdisjoint(address_keys(row.to))]
    return Composing(drafted, prior, len(kept) - len(drafted))


def store_drafting_run(
    env: Env, rows: list[BatchRow], batch: Path, options: Mapping[str, object], run_id: str
) -> Store:
    """The run and one pending draft per row, before any request: a crash from here on is
    resumed by drafting only the rows without a draft."""
    run = {
        "run_id": run_id,
        "state": RunState.PLANNED.value,
        "created_at": clock.now_iso(),
        "batch_path": shown_path(batch),
        "channel_snapshot": env.config.snapshot({row.channel for row in rows}),
        "options": dict(options),
        "contract_version": CONTRACT_VERSION,
        # Made now, used when the drafts are frozen into intents (perhaps by a later resume).
        "key_nonce": new_key_nonce(),
    }
    store = open_store(env, create=True)
    try:
        with suppress(KeyError):
            store.core.get_run(run_id)
            raise BadInput(f"run {run_id!r} already exists: choose another --run-id.")
        store.drafts.create_drafting_run(
            run,
            [(row.seq, row.line, compose.row_to_source(row), source_digest(row)) for row in rows],
        )
    except BaseException:
        store.close()
        raise
    return store


def shown_path(batch: Path) -> str:
    """The batch file's name as a run stores it: as written, or, for a name in bytes that
    are not UTF-8 (a file copied from an older system), with those bytes escaped (`\\xff`),
    since a database column holds text, and the name is only ever shown."""
    return os.fsencode(batch).decode("utf-8", "backslashreplace")
