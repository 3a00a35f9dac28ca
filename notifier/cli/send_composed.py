"""`send --compose` on the command line: the brief it reads, the first drafts a dry run
shows (which the API bills), and what it prints while the API (notifier/api) compares the rows,
stores them, drafts, freezes and sends them."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from notifier.cli import running
from notifier.cli.group import echo, warn
from notifier.domain.errors import BadInput, ExitCode
from notifier.domain.state_machine import RunState

if TYPE_CHECKING:
    from notifier.cli.send_file import Sending, SendOptions
    from notifier.content import compose
    from notifier.content.batch_csv import BatchRow
    from notifier.content.template import Template


# The options that say how Claude drafts: meaningless, and misleading, without --compose.
_DRAFTING = {"model": "--model", "batch_api": "--batch-api", "compose_columns": "--compose-columns"}


def drafting_needs_compose(ctx: click.Context, options: SendOptions) -> None:
    """Given without --compose, an option of drafting would be ignored while the operator
    believes the rows are drafted so: a usage error (exit 2) before anything is stored."""
    if options.compose_path is not None:
        return
    given = [
        flag
        for name, flag in _DRAFTING.items()
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ]
    if given:
        raise BadInput(
            f"{', '.join(given)} applies only with --compose BRIEF (Claude drafting each row); "
            "without it the rows are sent as written, so nothing was stored or sent. Add "
            f"`--compose BRIEF`, or drop {', '.join(given)}."
        )


def read_brief(path: Path) -> str:
    try:
        brief = path.read_text("utf-8").strip()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the brief ({exc.strerror}).") from exc
    except UnicodeDecodeError as exc:
        raise BadInput(
            f"{path}: the brief is not UTF-8 text ({exc.reason} at byte {exc.start}); save it "
            "as UTF-8 and run the command again. Nothing was stored."
        ) from exc
    if not brief:
        raise BadInput(f"{path}: the brief is empty: say what the notifications should say.")
    return brief


def dry_run_drafts(
    settings: compose.Settings, key: str, rows: list[BatchRow], template: Template | None
) -> None:
    from notifier.content import claude_messages, compose  # noqa: PLC0415 (the SDK loads only when drafting)

    count = min(len(rows), compose.DRY_RUN_ROWS)
    echo(
        f"dry run: drafting the first {count} of {len(rows)} rows with {settings.model} to show "
        "them (billed to the key in the environment; rehearse for free against `notifier "
        "sandbox`, see README)."
    )
    drafter = claude_messages.Drafter(settings, key)
    try:
        shown = compose.first_drafts(drafter, rows[: compose.DRY_RUN_ROWS])
    finally:
        drafter.close()
    for row, draft in shown:
        click.echo(f"  #{row.seq} {row.item_id} → {row.to} via {row.channel}")
        if isinstance(draft, str):
            click.echo(f"    {draft}")
            continue
        try:
            final = compose.apply_draft(row, asdict(draft), template)
        except compose.DraftRejected as exc:  # the template renders it against the rules
            click.echo(f"    draft failed: {exc}")
            continue
        click.echo(f"    subject: {final.subject}")
        for n, text in enumerate(final.body.splitlines() or [""]):
            click.echo(("    body:    " if n == 0 else "             ") + text)
        click.echo(f"    ({draft.model}, {draft.input_tokens}+{draft.output_tokens} tokens)")
    echo(
        f"dry run: drafted the first {len(shown)} of {len(rows)} rows with {settings.model}; "
        "nothing stored."
    )


def send_composed(sending: Sending, settings: compose.Settings) -> None:
    """send --compose: store the rows, draft them (stored one by one), freeze the intents,
    then wait for approval or send. Rows are scheduled as they are read, as a plain send
    schedules them, so the model never sees their `tz` and `not_before` columns."""
    from notifier.cli.earlier import prior_summary  # noqa: PLC0415 (start-up time)
    from notifier.content import compose as composer  # noqa: PLC0415
    from notifier.content import drafting  # noqa: PLC0415 (start-up time)
    from notifier.content.plan import new_run_id  # noqa: PLC0415
    from notifier.content.schedule import late_warning  # noqa: PLC0415

    notifier, given, batch, options = (
        sending.notifier,
        sending.given,
        sending.batch,
        sending.options,
    )
    key = drafting.compose_key()  # before anything is stored
    try:
        with running.naming_stdin(sending.source, batch):
            rows = notifier.compose_rows(
                sending.source,
                batch,
                channel=given.channel,
                run_id=given.run_id,
                not_after=sending.not_after,
                schedule=sending.when,
                allow_duplicates=given.allow_duplicates,
            )
    except KeyboardInterrupt:
        raise sending.interrupted_planning() from None
    if (late := late_warning(sending.when)) is not None:
        warn(late)
    settings = drafting.settle_settings(
        settings, rows, batch, given.compose_columns, dry_run=given.dry_run
    )
    drafting.check_model(settings, key)  # an unknown model: exit 2, nothing stored
    if sending.template is not None:
        composer.check_template(sending.template, rows, batch)
        options["template"] = sending.template.as_options()
    if given.dry_run:
        dry_run_drafts(settings, key, rows, sending.template)
        return
    options["compose"] = settings.as_options()
    composed = notifier.store_composed(rows, batch, options, given.run_id or new_run_id())
    for line in prior_summary(composed.prior):
        echo(line)
    if composed.suppressed:
        echo(
            f"{composed.suppressed} row(s) left out: their recipient is on the suppression "
            "list, so they are neither drafted nor sent (`notifier suppress list`)."
        )
    if composed.run is None:
        echo(f"nothing to send: no row of {batch} is left to draft.")
        return
    run_id = composed.run.run_id
    echo(f"planned run {run_id}: {composed.to_draft} rows to draft with {settings.model}")
    drafted = running.draft(sending.ctx, notifier, run_id)
    failures = running.report_draft_failures(drafted)
    run = drafted.run
    echo(f"fingerprint: {run.fingerprint}")
    if run.state is RunState.AWAITING_APPROVAL:
        running.await_approval(notifier, run)
        sending.ctx.exit(ExitCode.ATTENTION if failures else ExitCode.DONE)
    total = notifier.counts(run_id).total
    sending.send_stored(run_id, total, {}, failures)
