"""The commands around a run planned with --require-approval: preview it, approve it (bound
to its fingerprint), reject it, or redraft some of its rows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from notifier.api.env import open_store, pick_run
from notifier.cli import running
from notifier.cli.group import cli, command_env, echo, suggesting
from notifier.cli.output import chosen_format, format_options, refuse_the_database, unwritable
from notifier.domain import clock
from notifier.domain.errors import ExitCode, Refused
from notifier.domain.records import notifications
from notifier.ops import approval

if TYPE_CHECKING:
    from collections.abc import Iterator

    from notifier.content import redraft as redraft_module
    from notifier.ops.preview import Review


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
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)

    env = command_env(ctx)
    try:
        run, granted = Notifier(env).approve(run_id, fingerprint, expires_in=expires_in)
    except approval.NotApproved as refused:
        raise running.not_approved(refused) from refused
    echo(
        f"run {run.run_id} approved by {granted.operator} until "
        f"{clock.local(granted.expires_at)} for fingerprint {granted.fingerprint} (state "
        f"version {granted.state_version}). Send it with `notifier resume {run.run_id}`."
    )


@cli.command()
@click.argument("run_id", required=False)
@format_options(
    ("table", "json", "jsonl", "csv"),
    "table: the first rows (every one with --output); json (one document, the fingerprint "
    "in it), jsonl, csv: every notification.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write to this file instead of stdout.",
)
@click.pass_context
def preview(
    ctx: click.Context, run_id: str | None, fmt: str, as_json: bool, output: Path | None
) -> None:
    """Write every notification of a run as it will be sent, then its fingerprint.

    The fingerprint line (`fingerprint: sha256:…`) is the last line printed: on stdout,
    except after json, jsonl or csv on stdout (which then holds only notifications), on
    stderr."""
    from notifier.ops import preview as review_module  # noqa: PLC0415 (start-up time)

    fmt = chosen_format(ctx, fmt, as_json)
    if output is not None:
        refuse_the_database(output, "--output", ctx.obj["db"])
    env = command_env(ctx, machine_output=fmt != "table")
    store = open_store(env, readonly=True)
    try:
        run = pick_run(store, run_id)
        review = review_module.Review(store, run)
        if fmt == "table":  # a file holds every notification
            pieces = _table(review, None if output is not None else review_module.TABLE_ROWS)
        else:
            pieces = review_module.WRITERS[fmt](review)
        try:
            if output is None:
                for piece in pieces:
                    click.echo(piece, nl=False)  # the notifications as they will be sent
            else:
                try:
                    with output.open("w", encoding="utf-8", newline="") as handle:
                        for piece in pieces:
                            handle.write(piece)
                except OSError as exc:
                    raise unwritable(output, "--output", exc) from None
        finally:
            # A read cut short (`| head` closed the pipe) ends here, while the store is open:
            # left to the garbage collector, it would close its cursor on a closed database
            # and Python would print that on stderr.
            getattr(pieces, "close", lambda: None)()
        try:
            line = review_module.fingerprint_line(review.fingerprint())
        except approval.NotApproved as refused:
            raise running.not_approved(refused) from refused
    finally:
        store.close()
    if output is not None:
        echo(f"wrote {notifications(review.count)} of run {run.run_id} to {output}.")
    echo(line, err=output is None and fmt != "table")


def _table(review: Review, rows: int | None) -> Iterator[str]:
    """The preview's table, then how many notifications there are, and where to read those
    it left out."""
    from notifier.ops.preview import iter_table  # noqa: PLC0415 (start-up time)

    yield from iter_table(review, rows)
    shown = review.count if rows is None else min(rows, review.count)
    more = review.count - shown
    tail = (
        suggesting(
            f"; {more} more not shown: `notifier preview {review.run.run_id} --format csv "
            "--output FILE` (or --format jsonl) writes every one"
        )
        if more
        else ""
    )
    yield f"{notifications(review.count)}, {shown} shown{tail}.\n"


@cli.command()
@click.argument("run_id", required=False)
@click.option("--reason", required=True, help="Why the run is rejected (kept in its audit).")
@click.pass_context
def reject(ctx: click.Context, run_id: str | None, reason: str) -> None:
    """Close a run awaiting approval without sending anything, with the reason audited."""
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)

    env = command_env(ctx)
    run, operator = Notifier(env).reject(run_id, reason)
    echo(
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
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)
    from notifier.cli.outcome import error_message  # noqa: PLC0415
    from notifier.store import LostRace  # noqa: PLC0415

    try:
        result = Notifier(command_env(ctx)).redraft(run_id, items)
    except LostRace as exc:
        raise Refused(
            f"run {run_id or 'the newest run'} changed while it was being redrafted "
            f"({error_message(exc)}): "
            "another command approved, rejected or redrafted it; nothing was changed by this "
            "one. `notifier status` shows where it stands."
        ) from exc
    for line in _redraft_summary(result):
        echo(line)
    if result.kept:  # asked for, not done: those rows keep their draft
        ctx.exit(ExitCode.ATTENTION)


def _redraft_summary(result: redraft_module.Result) -> list[str]:
    """Each row's new subject, and the fingerprint change: the fingerprint to approve is
    shown only by `preview`, after what it covers, never here for drafts nobody has seen."""
    rid = result.run.run_id
    lines = [
        f"row {r.item_id}: redrafted with {r.draft.model} ({r.draft.input_tokens}+"
        f"{r.draft.output_tokens} tokens); subject: {r.draft.subject}"
        for r in result.redrafted
    ]
    lines.append(
        f"run {rid}: {len(result.redrafted)} row(s) redrafted"
        + (f", {len(result.kept)} kept their draft" if result.kept else "")
        + f"; its fingerprint changed (was {result.before[:19]}…), so any approval of the old "
        f"one is void. {running.review_advice(rid)}"
    )
    return lines
