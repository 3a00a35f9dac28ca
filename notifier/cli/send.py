"""`notifier send`: its options, and which path sends the batch: a file as written
(send_file.py) or drafted by Claude (send_composed.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from notifier.cli import running, send_composed, watching
from notifier.cli.group import cli, command_env
from notifier.cli.send_file import Sending, SendOptions, send_file

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
    type=running.WAIT,
    default=600,
    show_default=True,
    help="Longest Retry-After to wait out, in seconds; longer pauses the run.",
)
@click.option(
    "--rate",
    type=running.RATE,
    help="Most sends per second on each channel (overrides a channel's `rate`).",
)
@watching.observe_options
@click.pass_context
def send(ctx: click.Context, /, batch: Path, **given: Any) -> None:
    """Validate BATCH.csv, store every intent, then send each notification durably.

    BATCH is a CSV file, or `-` for rows piped in on standard input.

    \b
    Examples:
      notifier send examples/batch.csv                     # to ./outbox/, receipts.db
      notifier send campaign.csv --channel mail --concurrency 8 --require-approval
      notifier send alerts.csv --channel hooks --not-after 2026-12-24T18:00:00+01:00
      notifier send people.csv --compose brief.txt --tz Europe/Paris --window "Mon-Fri 09:00-17:00"
    """
    from notifier.api import Notifier  # noqa: PLC0415
    from notifier.content import compose, schedule  # noqa: PLC0415 (start-up time)
    from notifier.engine import crash  # noqa: PLC0415 (start-up time)

    options = SendOptions(**given)
    send_composed.drafting_needs_compose(ctx, options)
    env = command_env(ctx)
    rehearsal = crash.from_env()  # a mistyped NOTIFIER_CRASH_AT: exit 2 before anything is stored
    # A --metrics-port in use is a usage error too: the port is bound before anything is stored.
    observer = watching.make_observer(
        env, options.metrics_port, options.log_format, options.log_bodies
    )
    ctx.call_on_close(observer.close)
    template = None
    if options.template_path is not None:
        from notifier.content.template import load  # noqa: PLC0415 (start-up time)

        template = load(options.template_path)
    sending = Sending(
        ctx,
        Notifier(env),
        source=batch,  # rows piped in are read from their spool, named `-` everywhere else
        batch=running.batch_name(ctx, batch),
        given=options,
        options=options.stored(),
        template=template,
        not_after=running.deadline_option(options.not_after_text, options.allow_expired),
        when=schedule.from_options(
            options.not_before_text, options.tz, options.window, env.config.channels
        ),
        observer=observer,
    )
    if options.compose_path is None:
        send_file(sending, rehearsal)
        return
    brief = send_composed.read_brief(options.compose_path)
    send_composed.send_composed(
        sending, compose.Settings(brief, options.model, batch_api=options.batch_api)
    )
