"""The `notifier` command line: parse options, call app.py, render, map errors to exit codes.

Exit codes (docs/design.md sections 7 and 11): 0 done; 1 internal error; 2 usage or bad input
(nothing changed); 3 stopped with items needing attention or paused; 4 refused for safety; 130
interrupted; 137 simulated crash.

A command imports what only it uses (app.py and all that sending needs, the sandbox's HTTP
server) when it runs, so that `status`, `report` and `runs` start fast.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import approval, clock, report
from .config import load as load_config
from .env import Env, open_store, pick_run
from .errors import BadInput, ExitCode, Interrupted, NotifierError, Refused
from .state_machine import FINISHED_RUN_STATES, ItemState, RunState, RunTrigger
from .store import NotADatabasePath, parse_target

if TYPE_CHECKING:
    from rich.console import Console

    from . import compose
    from .app import Stored
    from .batch import BatchRow
    from .plan import Plan
    from .records import Run
    from .runner import RunOptions, RunResult
    from .store import Store
    from .template import Template

# `send --compose` drafts with this model unless --model names another.
DEFAULT_MODEL = "claude-sonnet-5"


@functools.cache
def _exception_for(code: ExitCode) -> type[click.ClickException]:
    """A click exception class that exits with `code` (click reads exit_code from the class)."""
    return type(f"Exit{int(code)}", (click.ClickException,), {"exit_code": int(code)})


def _Failure(message: str, code: ExitCode) -> click.ClickException:
    """A failure on its way out: click prints its message and exits with `code`."""
    return _exception_for(code)(message)


# Commands that only look at runs: one cut short by a reader that stopped reading (`notifier
# report | head`) has done what was asked of it.
_LOOKS = frozenset({"status", "report", "runs", "preview"})


def _drop_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it once more on the way out, and on a pipe
    whose reader has gone that flush would fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # not a real file (a test's captured output): nothing will flush to a pipe


class NotifierGroup(click.Group):
    """The one place where failures become exit codes: a NotifierError carries its own, a
    storage failure is named with its cause and fix, anything else is an internal error
    (exit 1) without a traceback unless NOTIFIER_DEBUG."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except NotifierError as exc:
            raise _Failure(str(exc), exc.exit_code) from exc
        except KeyboardInterrupt as exc:
            # Ctrl-C outside the places that say more (planning, sending, drafting, manual
            # decisions): click would print "Aborted!" and exit 1, as if something broke.
            raise _Failure(
                "interrupted (Ctrl-C). Every change already made is durable: `notifier "
                "status` shows where the run stands, and `notifier resume` continues it.",
                ExitCode.INTERRUPTED,
            ) from exc
        except BrokenPipeError as exc:
            _drop_stdout()
            if ctx.invoked_subcommand in _LOOKS:
                raise click.exceptions.Exit(0) from exc  # `| head` had what it wanted
            raise _Failure(
                "the output was closed before notifier had written all of it (a pipe into "
                "`head`?). What the command did is durable: `notifier status` shows where "
                "the run stands, and `notifier resume` continues it if it did not finish.",
                ExitCode.INTERNAL,
            ) from exc
        except Exception as exc:
            if os.environ.get("NOTIFIER_DEBUG"):
                traceback.print_exc()
            raise _Failure(
                f"internal error: {type(exc).__name__}: {exc}. Nothing was lost: every "
                "state change is durable; `notifier status` shows where the run stands. "
                "Set NOTIFIER_DEBUG=1 for a traceback.",
                ExitCode.INTERNAL,
            ) from exc


@click.group(cls=NotifierGroup)
@click.version_option(package_name="notifier")
@click.option(
    "--db",
    envvar="NOTIFIER_DB",
    default="receipts.db",
    show_default=True,
    help="The receipts database: a file (SQLite), or a postgresql:// URL shared by many "
    "workers (env NOTIFIER_DB).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Channel definitions (default: ./notifier.toml when present).",
)
@click.pass_context
def cli(ctx: click.Context, db: str, config_path: Path | None) -> None:
    """Send a batch of notifications durably: nothing lost, nothing sent twice."""
    try:
        target = parse_target(db)
    except NotADatabasePath as exc:
        raise click.BadParameter(str(exc), param_hint="--db") from None
    ctx.obj = {"db": target, "config": config_path}


_format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="How to print the report.",
)


def _env(ctx: click.Context, *, machine_output: bool = False) -> Env:
    """With `machine_output` (JSON or CSV on stdout), running commentary goes to stderr."""
    explicit = ctx.obj["config"] is not None
    config = load_config(ctx.obj["config"] or Path("notifier.toml"), explicit=explicit)
    return Env(target=ctx.obj["db"], config=config, say=_say_err if machine_output else _say)


def _say(line: str) -> None:
    click.echo(line)


def _say_err(line: str) -> None:
    click.echo(line, err=True)


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal's stderr; elsewhere (a pipe, a log) nothing, and rich
    is not even loaded."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console  # noqa: PLC0415 (start-up time)
    from rich.progress import (  # noqa: PLC0415 (start-up time)
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    with Progress(
        TextColumn("sending"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("send", total=total)
        yield lambda n: progress.advance(task, n)


def _finish(
    ctx: click.Context,
    run_id: str,
    result: RunResult,
    draft_failures: int = 0,
    *,
    batch: str | None = None,
) -> None:
    from .outcome import run_advice, run_exit  # noqa: PLC0415 (start-up time)

    advice = run_advice(result, run_id, batch or "BATCH.csv")
    click.echo(f"run {run_id}: {result.reason}." + (f" {advice}" if advice else ""))
    code = run_exit(result)
    if draft_failures and code is ExitCode.DONE:
        code = ExitCode.ATTENTION  # the rows whose draft failed were never planned
    ctx.exit(code)


def _dry_run_drafts(
    settings: compose.Settings, key: str, rows: list[BatchRow], template: Template | None
) -> None:
    from . import claude, compose  # noqa: PLC0415 (the SDK loads only when drafting)

    drafter = claude.Drafter(settings, key)
    try:
        shown = compose.first_drafts(drafter, rows[: compose.DRY_RUN_ROWS])
    finally:
        drafter.close()
    for row, draft in shown:
        click.echo(f"  #{row.seq} {row.item_id} → {row.to} via {row.channel}")
        if isinstance(draft, str):
            click.echo(f"    {draft}")
            continue
        final = compose.apply_draft(row, asdict(draft), template)
        click.echo(f"    subject: {final.subject}")
        for n, text in enumerate(final.body.splitlines() or [""]):
            click.echo(("    body:    " if n == 0 else "             ") + text)
        click.echo(f"    ({draft.model}, {draft.input_tokens}+{draft.output_tokens} tokens)")
    click.echo(
        f"dry run: drafted the first {len(shown)} of {len(rows)} rows with {settings.model}; "
        "nothing stored."
    )


def _draft(ctx: click.Context, env: Env, store: Store, run: Run) -> Run:
    """Draft what a --compose run lacks; Ctrl-C leaves with 130, the drafts made stored."""
    from . import app  # noqa: PLC0415 (start-up time)

    try:
        return app.draft_run(env, store, run)
    except KeyboardInterrupt:
        click.echo(
            f"interrupted while drafting: the drafts already made are stored and nothing was "
            f"sent. `notifier resume {run.run_id}` drafts the rest.",
            err=True,
        )
        ctx.exit(ExitCode.INTERRUPTED)
        raise  # unreachable: ctx.exit raises


def _report_draft_failures(store: Store, run: Run) -> int:
    failures = store.draft_failures(run.run_id)
    for seq, line, error in failures:
        click.echo(f"row {seq} (line {line}) was not drafted and will not be sent: {error}")
    return len(failures)


@cli.command()
@click.argument("batch", type=click.Path(exists=True, dir_okay=False, path_type=Path))
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
    "--require-approval",
    is_flag=True,
    help="Store the plan and stop in awaiting_approval; `notifier approve` lets it send.",
)
@click.option("--dry-run", is_flag=True, help="Validate and show the plan; write nothing.")
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
    max_wait: float,
    template_path: Path | None,
    require_approval: bool,
    not_after_text: str | None,
    compose_path: Path | None,
    model: str,
    batch_api: bool,
    compose_columns: str | None,
    rate: float | None,
) -> None:
    """Validate BATCH.csv, store every intent, then send each notification durably."""
    from . import app, compose, crash  # noqa: PLC0415 (start-up time)
    from .runner import RunOptions  # noqa: PLC0415

    env = _env(ctx)
    crash.from_env()  # a mistyped NOTIFIER_CRASH_AT is a usage error before anything is stored
    template = None
    if template_path is not None:
        from .template import load  # noqa: PLC0415 (start-up time)

        template = load(template_path)
    not_after = _deadline_option(not_after_text)
    # Kept with the run, so `resume` sends at the same pace unless told otherwise.
    options: dict[str, object] = {"concurrency": concurrency, "max_wait": max_wait, "rate": rate}
    if require_approval:
        options["require_approval"] = True
    if compose_path is not None:
        _send_compose(
            ctx,
            env,
            batch,
            compose.Settings(_read_brief(compose_path), model, batch_api=batch_api),
            template,
            options,
            columns=compose_columns,
            channel=channel,
            run_id=run_id,
            not_after=not_after,
            dry_run=dry_run,
        )
        return
    try:
        plan = app.plan_batch(
            env, batch, channel=channel, run_id=run_id, template=template, not_after=not_after
        )
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_planning(batch)) from None
    if dry_run:
        _dry_run(env, plan, batch, new_run=new_run, resend_changed=resend_changed)
        return
    then = RunTrigger.REQUEST_APPROVAL if require_approval else None
    stored = _store_plan(env, plan, batch, options, new_run, resend_changed, then)
    for line in app.prior_summary(stored.prior) if stored.prior else []:
        click.echo(line)
    if stored.store is None:
        click.echo(
            f"nothing to send: every row of {batch} was already delivered with the same "
            "content. `notifier runs` lists the runs; --new-run sends every row again."
        )
        return
    store = stored.store
    try:
        run = store.get_run(plan.run_id)
        counts = store.counts(plan.run_id)
        left_out = stored.prior is not None and stored.prior.left < plan.count
        channels = store.per_channel(run.run_id) if left_out else plan.per_channel
        per_channel = ", ".join(f"{name}: {n}" for name, n in sorted(channels.items()))
        click.echo(f"planned run {run.run_id}: {counts.total} notifications ({per_channel})")
        click.echo(f"fingerprint: {run.fingerprint}")
        if run.state is RunState.AWAITING_APPROVAL:
            _await_approval(store, run)
            return
        with _progress(counts.total) as advance:
            result = app.work_run(
                env, store, run, RunOptions(concurrency, max_wait, rate=rate), advance=advance
            )
    finally:
        store.close()
    _finish(ctx, plan.run_id, result, batch=str(batch))


def _dry_run(env: Env, plan: Plan, batch: Path, *, new_run: bool, resend_changed: bool) -> None:
    """What `send` would plan, and why; nothing is written."""
    from . import app  # noqa: PLC0415 (start-up time)

    try:
        checked = app.dry_run(env, plan)
    finally:
        plan.close()
    per_channel = ", ".join(f"{name}: {n}" for name, n in sorted(plan.per_channel.items()))
    click.echo(f"dry run: {plan.count} notifications ({per_channel}); nothing written.")
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
    from . import app  # noqa: PLC0415 (start-up time)

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
        raise Interrupted(_interrupted_storing(env, batch, plan.run_id)) from None


def _interrupted_planning(batch: Path) -> str:
    return (
        f"interrupted (Ctrl-C) while reading and planning {batch}: nothing was stored and "
        f"nothing was sent. Run `notifier send {batch}` again to plan and send it."
    )


def _interrupted_storing(env: Env, batch: Path, run_id: str) -> str:
    """Ctrl-C while the plan was being stored: its one transaction either committed or rolled
    back; the database says which."""
    from . import app  # noqa: PLC0415 (start-up time)

    stored = app.run_stored(env, run_id)
    if stored is False:
        return _interrupted_planning(batch)
    if stored:
        return (
            f"interrupted (Ctrl-C) right after run {run_id} was stored: nothing was sent. "
            f"`notifier resume {run_id}` sends it."
        )
    return (
        f"interrupted (Ctrl-C) while storing the plan of {batch} as run {run_id}; nothing was "
        f"sent. `notifier runs` shows whether it was stored: if so, `notifier resume {run_id}` "
        f"sends it, else run `notifier send {batch}` again."
    )


def _read_brief(path: Path) -> str:
    brief = path.read_text("utf-8").strip()
    if not brief:
        raise BadInput(f"{path}: the brief is empty: say what the notifications should say.")
    return brief


def _send_compose(
    ctx: click.Context,
    env: Env,
    batch: Path,
    settings: compose.Settings,
    template: Template | None,
    options: dict[str, object],
    *,
    columns: str | None,
    channel: str | None,
    run_id: str | None,
    not_after: datetime | None,
    dry_run: bool,
) -> None:
    """send --compose: store the rows, draft them (stored one by one), freeze the intents,
    then wait for approval or send."""
    from . import app, compose, drafting  # noqa: PLC0415 (start-up time)
    from .plan import new_run_id  # noqa: PLC0415

    key = app.compose_key()  # before anything is stored
    try:
        rows = app.read_rows(env, batch, channel=channel, run_id=run_id, not_after=not_after)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_planning(batch)) from None
    settings = drafting.settle_settings(settings, rows, batch, columns, dry_run=dry_run)
    drafting.check_model(settings, key)  # an unknown model: exit 2, nothing stored
    if template is not None:
        compose.check_template(template, rows, batch)
        options["template"] = template.as_options()
    if dry_run:
        _dry_run_drafts(settings, key, rows, template)
        return
    options["compose"] = settings.as_options()
    if "require_approval" not in options:
        app.check_channels(env, {row.channel for row in rows})
    new_id = run_id or new_run_id()
    store = app.store_drafting_run(env, rows, batch, options, new_id)
    try:
        click.echo(f"planned run {new_id}: {len(rows)} rows to draft with {settings.model}")
        run = _draft(ctx, env, store, store.get_run(new_id))
        failures = _report_draft_failures(store, run)
        click.echo(f"fingerprint: {run.fingerprint}")
        if run.state is RunState.AWAITING_APPROVAL:
            _await_approval(store, run)
            ctx.exit(ExitCode.ATTENTION if failures else ExitCode.DONE)
        with _progress(store.counts(run.run_id).total) as advance:
            result = app.work_run(env, store, run, _run_options(options), advance=advance)
    finally:
        store.close()
    _finish(ctx, new_id, result, failures, batch=str(batch))


def _run_options(options: dict[str, object]) -> RunOptions:
    from .runner import RunOptions  # noqa: PLC0415 (start-up time)

    rate = options.get("rate")
    return RunOptions(
        int(str(options["concurrency"])),
        float(str(options["max_wait"])),
        rate=float(str(rate)) if rate is not None else None,
    )


def _deadline_option(text: str | None) -> datetime | None:
    if text is None:
        return None
    from .batch import parse_deadline  # noqa: PLC0415 (start-up time)

    try:
        return parse_deadline(text)
    except ValueError as exc:
        raise BadInput(
            f"--not-after: {exc}. Use ISO 8601 with a zone, e.g. 2026-12-01T09:00:00+01:00."
        ) from exc


def _await_approval(store: Store, run: Run) -> None:
    for line in approval.preview(store, run):
        click.echo(line)
    click.echo(
        f"run {run.run_id} is awaiting approval; nothing was sent. "
        f"{approval.review_advice(run.run_id)} Then `notifier resume {run.run_id}` sends it."
    )


@cli.command()
@click.argument("run_id", required=False)
@click.option(
    "--fingerprint",
    required=True,
    help="The sha256:… fingerprint on the last line of `notifier preview`. Without RUN_ID: "
    "approves the run awaiting approval whose fingerprint it is.",
)
@click.option(
    "--expires-in",
    default=approval.DEFAULT_EXPIRES_IN,
    show_default=True,
    help="How long the approval holds: e.g. 30m, 1h, 2d; at most 30d.",
)
@click.pass_context
def approve(ctx: click.Context, run_id: str | None, fingerprint: str, expires_in: str) -> None:
    """Approve a run planned with --require-approval, bound to its fingerprint."""
    from . import app  # noqa: PLC0415 (start-up time)

    env = _env(ctx)
    run, granted = app.approve(env, run_id, fingerprint, expires_in)
    click.echo(
        f"run {run.run_id} approved by {granted.operator} until "
        f"{clock.local(granted.expires_at)} for fingerprint {granted.fingerprint} (state "
        f"version {granted.state_version}). Send it with `notifier resume {run.run_id}`."
    )


@cli.command()
@click.argument("run_id", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "jsonl", "csv"]),
    default="table",
    show_default=True,
    help="table: the first rows; jsonl, csv: every notification.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write to this file instead of stdout.",
)
@click.pass_context
def preview(ctx: click.Context, run_id: str | None, fmt: str, output: Path | None) -> None:
    """Write every notification of a run as it will be sent, then its fingerprint.

    The fingerprint line (`fingerprint: sha256:…`) is the last line printed: on stdout,
    except after jsonl or csv on stdout (which then holds only notifications), on stderr."""
    from . import preview as review_module  # noqa: PLC0415 (start-up time)

    env = _env(ctx)
    store = open_store(env, readonly=True)
    try:
        run = pick_run(store, run_id)
        try:
            review = review_module.Review(store, run)
        except approval.ApprovalUsage as exc:
            raise BadInput(str(exc)) from exc
        pieces = review_module.WRITERS[fmt](review)
        if output is None:
            for piece in pieces:
                click.echo(piece, nl=False)
        else:
            with output.open("w", encoding="utf-8", newline="") as handle:
                for piece in pieces:
                    handle.write(piece)
        try:
            line = review_module.fingerprint_line(review.fingerprint())
        except approval.ApprovalRefused as exc:
            raise Refused(str(exc)) from exc
    finally:
        store.close()
    if output is not None:
        click.echo(f"wrote the {review.count} notifications of run {run.run_id} to {output}.")
    click.echo(line, err=output is None and fmt != "table")


@cli.command()
@click.argument("run_id", required=False)
@click.option("--reason", required=True, help="Why the run is rejected (kept in its audit).")
@click.pass_context
def reject(ctx: click.Context, run_id: str | None, reason: str) -> None:
    """Close a run awaiting approval without sending anything, with the reason audited."""
    from . import app  # noqa: PLC0415 (start-up time)

    env = _env(ctx)
    run, operator = app.reject(env, run_id, reason)
    click.echo(
        f"run {run.run_id} rejected by {operator} and closed ({run.state.value}); nothing "
        f"was sent. `notifier report {run.run_id}` shows it."
    )


@cli.command()
@click.argument("run_id", required=False)
@click.option(
    "--item", "items", multiple=True, required=True, help="The id of a row to redraft (repeat)."
)
@click.pass_context
def redraft(ctx: click.Context, run_id: str | None, items: tuple[str, ...]) -> None:
    """Redraft rows of a --compose run awaiting approval; it must then be approved again."""
    from . import redraft as redrafting  # noqa: PLC0415 (start-up time)

    result = redrafting.command(_env(ctx), run_id, items)
    for line in redrafting.summary(result):
        click.echo(line)
    if result.kept:  # asked for, not done: those rows keep their draft
        ctx.exit(ExitCode.ATTENTION)


def _overrides(command: Callable[..., None]) -> Callable[..., None]:
    """The options `resume` and `worker` share: what may differ from the run's own."""
    for option in reversed(
        (
            click.argument("run_id", required=False),
            click.option(
                "--concurrency", type=click.IntRange(1, 64), help="Override the run's window size."
            ),
            click.option(
                "--max-wait", type=click.FloatRange(0), help="Override the run's --max-wait."
            ),
            click.option(
                "--rate",
                type=click.FloatRange(0, min_open=True),
                help="Override the run's --rate (sends per second on each channel).",
            ),
            click.pass_context,
        )
    ):
        command = option(command)
    return command


@cli.command()
@_overrides
@click.option("--model", help="A run still drafting: the model for the rows not drafted yet.")
@click.option(
    "--recreate",
    is_flag=True,
    help="A run drafting through batches: create again a batch whose creation is in doubt "
    "(it may be paid twice) instead of waiting to recognise it.",
)
def resume(
    ctx: click.Context,
    run_id: str | None,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
    model: str | None,
    recreate: bool,
) -> None:
    """Settle every in-flight item by asking the downstream, then continue in order."""
    _resume(ctx, run_id, concurrency, max_wait, rate, joining=False, model=model, recreate=recreate)


@cli.command()
@_overrides
def worker(
    ctx: click.Context,
    run_id: str | None,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
) -> None:
    """Join a run in a PostgreSQL database as one more worker, on any machine."""
    if not ctx.obj["db"].shares_runs:
        raise BadInput(
            f"{ctx.obj['db']}: `notifier worker` shares a run among processes through "
            "PostgreSQL (--db postgresql://…); an SQLite file is worked by one process at a "
            "time: use `notifier resume`."
        )
    _resume(ctx, run_id, concurrency, max_wait, rate, joining=True)


def _resume(
    ctx: click.Context,
    run_id: str | None,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
    *,
    joining: bool,
    model: str | None = None,
    recreate: bool = False,
) -> None:
    """`resume`, or with `joining` a `worker`, which finds a run already finished normal."""
    from . import app, compose, crash  # noqa: PLC0415 (start-up time)
    from .outcome import settled_exit  # noqa: PLC0415
    from .runner import RunOptions  # noqa: PLC0415

    env = _env(ctx)
    crash.from_env()
    store = open_store(env)
    try:
        run = pick_run(store, run_id, active_only=not joining or run_id is None)
        if run.state in FINISHED_RUN_STATES:
            if joining:
                counts = store.counts(run.run_id)
                click.echo(f"run {run.run_id} is already {run.state.value}: {counts.summary()}")
                ctx.exit(settled_exit(run.state, counts))
            raise BadInput(f"run {run.run_id} is {run.state.value}; there is nothing to resume.")
        drafting = compose.unfrozen(run)
        if model is not None or recreate:
            from . import drafting as drafts  # noqa: PLC0415 (start-up time)

            run = drafts.resume_overrides(env, store, run, model, recreate)
        run = _draft(ctx, env, store, run)
        failures = _report_draft_failures(store, run) if drafting else 0
        if drafting and run.state is RunState.AWAITING_APPROVAL:
            click.echo(f"fingerprint: {run.fingerprint}")
            _await_approval(store, run)
            ctx.exit(ExitCode.ATTENTION if failures else ExitCode.DONE)
        app.check_can_send(store, run)
        counts = store.counts(run.run_id)

        def announce() -> None:
            click.echo(f"resuming run {run.run_id}: {counts.summary()}")
            stale = store.past_deadline(run.run_id, clock.now_iso())
            if stale:
                click.echo(
                    f"{stale} pending item(s) are already past their not_after: they will be "
                    "expired, not sent."
                )

        options = RunOptions(
            concurrency or int(run.options.get("concurrency", 1)),
            max_wait if max_wait is not None else float(run.options.get("max_wait", 600)),
            rate=rate or _stored_rate(run.options),
            restart=not joining,
        )
        remaining = counts.unfinished
        with _progress(remaining) as advance:
            result = app.work_run(env, store, run, options, advance=advance, announce=announce)
    finally:
        store.close()
    _finish(ctx, run.run_id, result, failures, batch=run.batch_path)


def _stored_rate(options: dict[str, Any]) -> float | None:
    rate = options.get("rate")
    return float(rate) if rate else None


@cli.command()
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the report object as JSON.")
@click.pass_context
def status(ctx: click.Context, run_id: str | None, as_json: bool) -> None:
    """Show where a run stands (default: the newest run)."""
    _print_report(ctx, run_id, "json" if as_json else "table")


@cli.command(name="report")
@click.argument("run_id", required=False)
@_format_option
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in ItemState]),
    help="List only the items in this state (repeatable).",
)
@click.pass_context
def report_command(
    ctx: click.Context, run_id: str | None, fmt: str, states: tuple[str, ...]
) -> None:
    """Report which items were sent, which are unknown, pending or failed."""
    _print_report(ctx, run_id, fmt, [ItemState(s) for s in states])


def _print_report(
    ctx: click.Context, run_id: str | None, fmt: str, states: list[ItemState] | None = None
) -> None:
    env = _env(ctx)
    store = open_store(env, readonly=True)
    try:
        run = pick_run(store, run_id)
        data = report.build(store, run, attention_only=fmt == "table", states=states or None)
        try:
            _emit(data, fmt)
        finally:
            # A report cut short (a closed pipe) leaves its item rows half read: their
            # cursor goes before the store closes, not at exit, on a closed database.
            getattr(data["items"], "close", lambda: None)()
        if fmt == "table" and run.state is RunState.AWAITING_APPROVAL:
            for line in approval.preview(store, run):  # what an approval would cover
                click.echo(line)
    finally:
        store.close()


def _console() -> Console:
    """Tables for people: on a pipe (no terminal width to honour) wide enough not to fold
    run ids and keys. Markup is off: item ids, evidence, file names and error texts come from
    users and downstreams, and `[/x]` in one of them must print as written, not as a tag."""
    from rich.console import Console  # noqa: PLC0415 (start-up time)

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """rich would exit 1 at once; a closed pipe has one rule, in NotifierGroup.invoke."""
            self.quiet = True
            raise BrokenPipeError

    if sys.stdout.isatty():
        return _Console(markup=False)
    return _Console(width=200, markup=False)


def _emit(data: dict[str, Any], fmt: str) -> None:
    # Written as the items are read: a million-item report never sits in memory.
    if fmt == "json":
        for piece in report.iter_json(data):
            click.echo(piece, nl=False)
        click.echo("")
    elif fmt == "csv":
        for piece in report.iter_csv(data):
            click.echo(piece, nl=False)
    else:
        report.render_table(data, _console())


@cli.command()
@click.pass_context
def runs(ctx: click.Context) -> None:
    """List every run in the database, newest first."""
    env = _env(ctx)
    store = open_store(env, readonly=True)
    try:
        from rich.table import Table  # noqa: PLC0415 (start-up time)

        table = Table(show_header=True, header_style="bold")
        for name in ("run", "state", "created"):
            table.add_column(name, no_wrap=True)  # ids are copied from here: never fold them
        for name in ("total", "sent", "unknown", "pending", "failed"):
            table.add_column(name, justify="right")
        table.add_column("batch", overflow="fold")
        from .store.drafts import run_counts  # noqa: PLC0415 (start-up time)

        for run in store.runs():
            c = run_counts(store, run)
            table.add_row(
                run.run_id,
                report.effective_state(store, run).value,
                run.created_at[:19],
                str(c.total),
                str(c.sent),
                str(c.unknown),
                str(c.pending + c.in_flight),
                str(c.failed),
                run.batch_path,
            )
        _console().print(table)
    finally:
        store.close()


@cli.command()
@click.argument("run_id", required=False)
@click.option("--report", "with_report", is_flag=True, help="Print the report when done.")
@_format_option
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0),
    default=30,
    show_default=True,
    help="Seconds to wait for a live worker to stop.",
)
@click.pass_context
def cancel(
    ctx: click.Context, run_id: str | None, with_report: bool, fmt: str, wait_s: float
) -> None:
    """Stop dispatch now, settle in-flight items, and mark the run cancelled."""
    from . import app  # noqa: PLC0415 (start-up time)
    from .outcome import settled_exit  # noqa: PLC0415

    env = _env(ctx, machine_output=with_report and fmt != "table")
    result = app.cancel(env, run_id, wait_s)
    chunks_open = 0  # batch chunks the API could not be asked about: cancel again
    if result.run.options.get("compose") and result.run.state is RunState.CANCELLED:
        from . import drafting  # noqa: PLC0415 (start-up time)

        chunks_open = drafting.cancel_batches(env, result.run.run_id)  # left by a drafting
    env.say(result.message)
    if with_report:
        store = open_store(env)
        try:
            run = store.get_run(result.run.run_id)
            _emit(report.build(store, run, attention_only=fmt == "table"), fmt)
        finally:
            store.close()
    if not result.confirmed or chunks_open:
        ctx.exit(ExitCode.ATTENTION)
    ctx.exit(settled_exit(result.run.state, result.counts))


@cli.command()
@click.argument("run_id", required=False)
@click.option("--manual", is_flag=True, help="Settle unknown items by hand, with evidence.")
@click.option("--item", "item_ref", help="With --manual: the item id to settle.")
@click.option(
    "--mark", type=click.Choice(["sent", "not-sent", "abandon"]), help="With --item: the decision."
)
@click.option("--evidence", help="With --item: what the decision rests on.")
@click.pass_context
def reconcile(
    ctx: click.Context,
    run_id: str | None,
    manual: bool,
    item_ref: str | None,
    mark: str | None,
    evidence: str | None,
) -> None:
    """Settle in-flight and unknown items by query, or by hand with --manual."""
    from . import app  # noqa: PLC0415 (start-up time)
    from .manual import reconcile_manually  # noqa: PLC0415
    from .outcome import settled_exit  # noqa: PLC0415

    env = _env(ctx)
    if not manual:
        if item_ref or mark or evidence:
            raise BadInput("--item, --mark and --evidence go with --manual.")
        run, counts = app.reconcile_by_query(env, run_id)
        click.echo(f"run {run.run_id}: {run.state.value}")
        ctx.exit(settled_exit(run.state, counts))
    run, counts = reconcile_manually(env, run_id, item_ref, mark, evidence)
    ctx.exit(settled_exit(run.state, counts))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8025,
    show_default=True,
    help="Port (0: any free port).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for fault injection.")
@click.option("--latency-ms", type=click.FloatRange(0), default=0, help="Delay before answering.")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0, help="Share answered 503.")
@click.option(
    "--throttle-rate",
    type=click.FloatRange(0, 1),
    default=0,
    help="Share answered 429 with Retry-After.",
)
@click.option(
    "--retry-after",
    type=click.FloatRange(0),
    default=1,
    show_default=True,
    help="Seconds in the 429's Retry-After.",
)
@click.option("--error-rate", type=click.FloatRange(0, 1), default=0, help="Share answered 500.")
@click.option(
    "--drop-rate",
    type=click.FloatRange(0, 1),
    default=0,
    help="Share committed, then dropped without an answer.",
)
@click.option("--no-idempotent", is_flag=True, help="Every POST is a new delivery (no dedupe).")
@click.option(
    "--force-status",
    multiple=True,
    metavar="ITEM_ID=CODE",
    help="Always answer CODE for this item id (repeatable).",
)
def sandbox(
    host: str,
    port: int,
    seed: int,
    latency_ms: float,
    fail_rate: float,
    throttle_rate: float,
    retry_after: float,
    error_rate: float,
    drop_rate: float,
    no_idempotent: bool,
    force_status: tuple[str, ...],
) -> None:
    """Run a local notification provider with fault injection, for rehearsals and tests."""
    from .sandbox import Faults, run_sandbox  # noqa: PLC0415 (start-up time: an HTTP server)

    forced: dict[str, int] = {}
    for spec in force_status:
        item_id, _, code = spec.rpartition("=")
        if not item_id or not code.isdigit():
            raise BadInput(f"--force-status {spec!r}: use ITEM_ID=CODE, e.g. u3=410.")
        forced[item_id] = int(code)
    try:
        faults = Faults(
            seed=seed,
            latency_ms=latency_ms,
            fail_rate=fail_rate,
            throttle_rate=throttle_rate,
            retry_after=retry_after,
            error_rate=error_rate,
            drop_rate=drop_rate,
            idempotent=not no_idempotent,
            force_status=forced,
        )
        run_sandbox(host, port, faults, _say)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    except OSError as exc:
        raise BadInput(
            f"cannot listen on {host}:{port} ({exc.strerror}): choose another --port."
        ) from exc
    click.echo("sandbox stopped.")


def main() -> None:
    cli(prog_name="notifier")


if __name__ == "__main__":  # pragma: no cover
    main()
