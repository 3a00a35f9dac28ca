"""`notifier send`: plan a batch (or draft it with --compose), store it, then send it.

Planning and storing are one concern with many ways to stop (a dry run, a refusal, Ctrl-C
while reading or storing): they are kept here, apart from `resume`, which starts from a
stored run."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..env import Env
from ..errors import ExitCode, Interrupted
from ..records import notifications
from ..state_machine import RunState, RunTrigger
from . import composing, observing, running
from .group import cli, command_env

if TYPE_CHECKING:
    from .. import compose, schedule
    from ..app import Stored
    from ..batch import BatchRow
    from ..observe import Observer
    from ..plan import Plan
    from ..records import Counts, Run
    from ..store import Store
    from ..template import Template


# `send --compose` drafts with this model unless --model names another.
DEFAULT_MODEL = "claude-sonnet-5"


@cli.command()
@click.argument(
    "batch",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
    callback=running.batch_file,
)
@click.option("--channel", help="Channel for rows without a `channel` column value.")
@click.option("--run-id", help="Name the run (default: generated).")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Requests in flight at once (the window size).",
)
@click.option(
    "--template",
    "template_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML with `subject` and `body` (Jinja2), rendered with each row's columns.",
)
@click.option(
    "--compose",
    "compose_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="BRIEF",
    help="Have Claude draft each row's subject and body from this brief (ANTHROPIC_API_KEY).",
)
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help="With --compose: the Claude model that drafts.",
)
@click.option(
    "--batch-api",
    is_flag=True,
    help="With --compose: draft through the Message Batches API (half the price; by default "
    "above 1000 rows).",
)
@click.option(
    "--compose-columns",
    metavar="A,B",
    help="With --compose: the columns the model sees (default: every column but `to`).",
)
@click.option(
    "--not-after",
    "not_after_text",
    metavar="DATETIME",
    help="Deadline (ISO 8601 with a zone): an item not sent by then expires, never sent.",
)
@click.option(
    "--not-before",
    "not_before_text",
    metavar="DATETIME",
    help="Send nothing before then (ISO 8601; without a zone, in --tz).",
)
@click.option("--tz", metavar="NAME", help="IANA zone of rows without a `tz` column (UTC).")
@click.option(
    "--window",
    metavar="SPEC",
    help='When items may be sent, e.g. "Mon-Fri 09:00-18:00, Sat 10:00-14:00" (each row\'s tz).',
)
@click.option(
    "--require-approval",
    is_flag=True,
    help="Store the plan and stop in awaiting_approval; `notifier approve` lets it send.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate and show the plan; write nothing. With --compose, drafts (and pays for) "
    "the first 3 rows to show them.",
)
@click.option(
    "--new-run",
    is_flag=True,
    help="Plan every row again, even those earlier runs delivered or hold (no identity check).",
)
@click.option(
    "--resend-changed",
    is_flag=True,
    help="Send rows delivered before whose content changed, as new notifications.",
)
@click.option(
    "--allow-expired",
    is_flag=True,
    help="Plan with a --not-after already past (every item expires unsent).",
)
@click.option(
    "--allow-duplicates",
    is_flag=True,
    help="Send rows of a file without `id` whose channel, recipient and content repeat an "
    "earlier line (refused by default: the recipient would get every copy).",
)
@click.option(
    "--max-wait",
    type=click.FloatRange(0),
    default=600,
    show_default=True,
    help="Longest Retry-After to wait out, in seconds; longer pauses the run.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0, min_open=True),
    help="Most sends per second on each channel (overrides a channel's `rate`).",
)
@observing.observe_options
@click.pass_context
def send(
    ctx: click.Context,
    batch: Path,
    channel: str | None,
    run_id: str | None,
    concurrency: int,
    dry_run: bool,
    new_run: bool,
    resend_changed: bool,
    allow_expired: bool,
    allow_duplicates: bool,
    max_wait: float,
    template_path: Path | None,
    require_approval: bool,
    not_after_text: str | None,
    compose_path: Path | None,
    model: str,
    batch_api: bool,
    compose_columns: str | None,
    rate: float | None,
    not_before_text: str | None,
    tz: str | None,
    window: str | None,
    metrics_port: int | None,
    log_format: str,
    log_bodies: bool,
) -> None:
    """Validate BATCH.csv, store every intent, then send each notification durably.

    BATCH is a CSV file, or `-` for rows piped in on standard input.

    \b
    Examples:
      notifier send examples/batch.csv                     # to ./outbox/, receipts.db
      notifier send campaign.csv --channel mail --concurrency 8 --require-approval
      notifier send alerts.csv --channel hooks --not-after 2026-12-24T18:00:00+01:00
      notifier send people.csv --compose brief.txt --tz Europe/Paris --window "Mon-Fri 09:00-17:00"
    """
    from .. import app, compose, crash, schedule  # noqa: PLC0415 (start-up time)
    from ..runner import RunOptions  # noqa: PLC0415

    env = command_env(ctx)
    # Rows piped in are read from their spool; the run and the advice name them `-`.
    source, batch = batch, running.batch_name(ctx, batch)
    rehearsal = crash.from_env()  # a mistyped NOTIFIER_CRASH_AT: exit 2 before anything is stored
    # A --metrics-port in use is a usage error too: the port is bound before anything is stored.
    observer = observing.make_observer(env, metrics_port, log_format, log_bodies)
    ctx.call_on_close(observer.close)
    quiet = log_format == "json"  # stderr carries the JSON lines: no progress bar
    template = None
    if template_path is not None:
        from ..template import load  # noqa: PLC0415 (start-up time)

        template = load(template_path)
    not_after = running.deadline_option(not_after_text, allow_expired)
    options = app.stored_options(
        {"concurrency": concurrency, "max_wait": max_wait, "rate": rate},
        channel=channel, template_path=template_path and str(template_path),
        not_after=not_after_text, not_before=not_before_text, tz=tz, window=window,
        allow_duplicates=allow_duplicates or None, require_approval=require_approval or None,
    )  # fmt: skip
    when = schedule.from_options(not_before_text, tz, window, env.config.channels)
    if compose_path is not None:
        _send_compose(
            ctx,
            env,
            (source, batch),
            compose.Settings(composing.read_brief(compose_path), model, batch_api=batch_api),
            template,
            options,
            columns=compose_columns,
            channel=channel,
            run_id=run_id,
            not_after=not_after,
            when=when,
            dry_run=dry_run,
            observer=observer,
            quiet=quiet,
        )
        return
    try:
        plan = app.plan_batch(
            env,
            source,
            channel=channel,
            run_id=run_id,
            template=template,
            not_after=not_after,
            schedule=when,
            allow_duplicates=allow_duplicates,
            rehearsal=rehearsal,
        )
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_planning(batch, options)) from None
    if (late := schedule.late_warning(when)) is not None:
        click.echo(late, err=True)
    if dry_run:
        _dry_run(env, plan, batch, new_run=new_run, resend_changed=resend_changed)
        return
    if env.config.approval_required(plan.per_channel):
        options["require_approval"] = True  # the policy of notifier.toml, kept with the run
    then = RunTrigger.REQUEST_APPROVAL if options.get("require_approval") else None
    stored = _store_plan(env, plan, batch, options, new_run, resend_changed, then)
    for line in app.prior_summary(stored.prior) if stored.prior else []:
        click.echo(line)
    if stored.store is None:
        suppressed = stored.prior.suppressed_only if stored.prior is not None else 0
        click.echo(
            f"nothing to send: the {suppressed} row(s) of {batch} left to send all go to "
            "suppressed recipients (`notifier suppress list`); no run was stored."
            if suppressed
            else f"nothing to send: every row of {batch} was already delivered with the same "
            "content. `notifier runs` lists the runs; --new-run sends every row again."
        )
        return
    store = stored.store
    try:
        run, counts, channels = _announce(store, plan, stored)
        click.echo(f"fingerprint: {run.fingerprint}")
        if run.state is RunState.AWAITING_APPROVAL:
            running.await_approval(store, run)
            return
        observer.planned(run.run_id, counts.total, dict(channels))
        with running.progress(counts.total, quiet=quiet) as advance:
            result = app.work_run(
                env,
                store,
                run,
                RunOptions(concurrency, max_wait, rate=rate),
                advance=advance,
                observer=observer,
            )
    finally:
        store.close()
    running.finish(ctx, plan.run_id, result, again=_send_again(batch, options))


def _announce(store: Store, plan: Plan, stored: Stored) -> tuple[Run, Counts, dict[str, int]]:
    """Say what was planned: the run, its count per channel, and the rows suppressed."""
    run = store.core.get_run(plan.run_id)
    counts = store.queries.counts(plan.run_id)
    left_out = stored.prior is not None and stored.prior.left < plan.count
    channels = store.queries.per_channel(run.run_id) if left_out else plan.per_channel
    per_channel = ", ".join(f"{name}: {n}" for name, n in sorted(channels.items()))
    click.echo(f"planned run {run.run_id}: {notifications(counts.total)} ({per_channel})")
    if counts.suppressed:
        click.echo(
            f"{counts.suppressed} of them suppressed (their recipient is on the suppression "
            "list): stored, never sent. `notifier suppress list` shows the list."
        )
    return run, counts, dict(channels)


def _dry_run(env: Env, plan: Plan, batch: Path, *, new_run: bool, resend_changed: bool) -> None:
    """What `send` would plan, and why; nothing is written."""
    from .. import app  # noqa: PLC0415 (start-up time)

    try:
        checked = app.dry_run(env, plan)
    finally:
        plan.close()
    per_channel = ", ".join(f"{name}: {n}" for name, n in sorted(plan.per_channel.items()))
    click.echo(f"dry run: {notifications(plan.count)} ({per_channel}); nothing written.")
    click.echo(f"fingerprint: {plan.fingerprint}")
    prior = checked.prior
    if new_run:
        click.echo("--new-run: every row would be planned again.")
    elif prior.refused(resend_changed):
        click.echo(f"send would refuse it: {app.refusal_message(batch, prior)}")
    else:
        for line in app.prior_summary(prior):
            click.echo(line)
        click.echo(f"send would plan {prior.left} of them.")


def _store_plan(
    env: Env,
    plan: Plan,
    batch: Path,
    options: dict[str, object],
    new_run: bool,
    resend_changed: bool,
    then: RunTrigger | None,
) -> Stored:
    """Check the channels the run sends through (their secrets and URLs from the
    environment), then store the plan: exit 2 means nothing was stored. A run that waits for
    approval is sent later, perhaps elsewhere: its channels are checked when it is."""
    from .. import app  # noqa: PLC0415 (start-up time)

    try:
        if then is None:
            try:
                app.check_channels(env, plan.per_channel)
            except BaseException:
                plan.close()
                raise
        return app.store_plan(
            env, plan, batch, options, new_run, resend_changed=resend_changed, then=then
        )
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_storing(env, batch, plan.run_id, options)) from None


def _send_again(batch: Path, options: dict[str, object]) -> str:
    from ..outcome import send_again  # noqa: PLC0415 (start-up time)

    return send_again(str(batch), options)


def _interrupted_planning(batch: Path, options: dict[str, object]) -> str:
    return (
        f"interrupted (Ctrl-C) while reading and planning {batch}: nothing was stored and "
        f"nothing was sent. Run `{_send_again(batch, options)}` again to plan and send it."
    )


def _interrupted_storing(env: Env, batch: Path, run_id: str, options: dict[str, object]) -> str:
    """Ctrl-C while the plan was being stored: its one transaction either committed or rolled
    back; the database says which."""
    from .. import app  # noqa: PLC0415 (start-up time)

    stored = app.run_stored(env, run_id)
    if stored is False:
        return _interrupted_planning(batch, options)
    if stored:
        return (
            f"interrupted (Ctrl-C) right after run {run_id} was stored: nothing was sent. "
            f"`notifier resume {run_id}` sends it."
        )
    return (
        f"interrupted (Ctrl-C) while storing the plan of {batch} as run {run_id}; nothing was "
        f"sent. `notifier runs` shows whether it was stored: if so, `notifier resume {run_id}` "
        f"sends it, else run `{_send_again(batch, options)}` again."
    )


def _send_compose(
    ctx: click.Context,
    env: Env,
    files: tuple[Path, Path],
    settings: compose.Settings,
    template: Template | None,
    options: dict[str, object],
    *,
    columns: str | None,
    channel: str | None,
    run_id: str | None,
    not_after: datetime | None,
    when: schedule.Schedule,
    dry_run: bool,
    observer: Observer,
    quiet: bool,
) -> None:
    """send --compose: store the rows, draft them (stored one by one), freeze the intents,
    then wait for approval or send. Rows are scheduled as they are read, as a plain send
    schedules them, so the model never sees their `tz` and `not_before` columns."""
    from .. import app, compose, drafting  # noqa: PLC0415 (start-up time)
    from ..plan import new_run_id  # noqa: PLC0415

    batch = files[1]  # named so in every message (`-` for rows piped in); read from files[0]
    key = app.compose_key()  # before anything is stored
    rows = _read_scheduled(env, files, options, channel, run_id, not_after, when)
    settings = drafting.settle_settings(settings, rows, batch, columns, dry_run=dry_run)
    drafting.check_model(settings, key)  # an unknown model: exit 2, nothing stored
    if template is not None:
        compose.check_template(template, rows, batch)
        options["template"] = template.as_options()
    if dry_run:
        composing.dry_run_drafts(settings, key, rows, template)
        return
    options["compose"] = settings.as_options()
    if env.config.approval_required({row.channel for row in rows}):
        options["require_approval"] = True  # the policy of notifier.toml, kept with the run
    new_id = run_id or new_run_id()
    compared = app.compare_composed(env, rows, batch, new_id)  # before a token is spent
    if compared.prior.rejected_by:
        options["require_approval"] = True  # rows a reviewer rejected: reviewed again
    for line in app.prior_summary(compared.prior):
        click.echo(line)
    if compared.suppressed:
        click.echo(
            f"{compared.suppressed} row(s) left out: their recipient is on the suppression "
            "list, so they are neither drafted nor sent (`notifier suppress list`)."
        )
    rows = compared.rows
    if not rows:
        click.echo(f"nothing to send: no row of {batch} is left to draft.")
        return
    if "require_approval" not in options:
        app.check_channels(env, {row.channel for row in rows})
    store = app.store_drafting_run(env, rows, batch, options, new_id)
    try:
        click.echo(f"planned run {new_id}: {len(rows)} rows to draft with {settings.model}")
        run = running.draft(ctx, env, store, store.core.get_run(new_id))
        failures = running.report_draft_failures(store, run)
        click.echo(f"fingerprint: {run.fingerprint}")
        if run.state is RunState.AWAITING_APPROVAL:
            running.await_approval(store, run)
            ctx.exit(ExitCode.ATTENTION if failures else ExitCode.DONE)
        total = store.queries.counts(run.run_id).total
        observer.planned(run.run_id, total, {})
        with running.progress(total, quiet=quiet) as advance:
            result = app.work_run(
                env, store, run, running.run_options(options), advance=advance, observer=observer
            )
    finally:
        store.close()
    running.finish(ctx, new_id, result, failures, again=_send_again(batch, options))


def _read_scheduled(
    env: Env,
    files: tuple[Path, Path],
    options: dict[str, object],
    channel: str | None,
    run_id: str | None,
    not_after: datetime | None,
    when: schedule.Schedule,
) -> list[BatchRow]:
    """The rows of a --compose file, validated and scheduled, before a token is spent."""
    from .. import app, schedule  # noqa: PLC0415 (start-up time)

    source, batch = files
    try:
        rows = app.read_rows(env, source, channel=channel, run_id=run_id, not_after=not_after)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_planning(batch, options)) from None
    rows = schedule.scheduled(rows, when, batch)
    if (late := schedule.late_warning(when)) is not None:
        click.echo(late, err=True)
    return rows
