"""The commands that look at runs and stop or settle them: status, report, runs, cancel,
reconcile. `status`, `report` and `runs` are read-only and must start fast: nothing here
loads the API (and all that sending needs) at import time."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from notifier.api.env import open_store, pick_run
from notifier.cli.group import cli, command_env, echo, suggesting
from notifier.cli.output import chosen_format, format_options, json_flag
from notifier.domain.errors import BadInput, ExitCode
from notifier.domain.records import Counts
from notifier.domain.state_machine import ItemState, RunState
from notifier.ops import approval, report

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from notifier.content.drafting import BatchesLeftOpen
    from notifier.domain.records import Run
    from notifier.store import Store


_format_option = format_options(("table", "json", "csv"), "How to print the report.")


@cli.command()
@click.argument("run_id", required=False)
@json_flag("Print the report object as JSON (every item, as `report --json`).")
@click.pass_context
def status(ctx: click.Context, run_id: str | None, as_json: bool) -> None:
    """Show where a run stands (default: the newest run).

    \b
    Examples:
      notifier status                          # the newest run: counts, items needing attention
      notifier status RUN --json | jq .counts
    """
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
    ctx: click.Context, run_id: str | None, fmt: str, as_json: bool, states: tuple[str, ...]
) -> None:
    """Report which items were sent, which are unknown, pending or failed.

    \b
    Examples:
      notifier report                              # the newest run: counts, then every item
      notifier report RUN --format csv > items.csv # every item, for a spreadsheet
      notifier report RUN --state unknown --state failed --json
    """
    fmt = chosen_format(ctx, fmt, as_json)
    _print_report(ctx, run_id, fmt, [ItemState(s) for s in states], every_item=True)


def _print_report(
    ctx: click.Context,
    run_id: str | None,
    fmt: str,
    states: list[ItemState] | None = None,
    *,
    every_item: bool = False,
) -> None:
    """`status` (the counts and the items needing attention) or, with `every_item`,
    `report`, whose table goes on with every item, a line each, read as it is written."""
    env = command_env(ctx, machine_output=fmt != "table")
    store = open_store(env, readonly=True)
    try:
        # One snapshot for the whole report: its counts are read apart from its items
        # (streamed as they are written), and a live run's workers commit in between; read
        # at two moments, the report would count items in one state and list them in another.
        with store.reading():
            _report_of(store, run_id, fmt, states, every_item=every_item)
    finally:
        store.close()


def _report_of(
    store: Store, run_id: str | None, fmt: str, states: list[ItemState] | None, *, every_item: bool
) -> None:
    run = pick_run(store, run_id)
    data = report.build(store, run, attention_only=fmt == "table", states=states or None)
    try:
        _emit(data, fmt)
    finally:
        # A report cut short (a closed pipe) leaves its item rows half read: their
        # cursor goes before the store closes, not at exit, on a closed database.
        getattr(data["items"], "close", lambda: None)()
    if fmt == "table" and run.state is RunState.AWAITING_APPROVAL:
        from notifier.cli.running import glimpse_lines  # noqa: PLC0415 (start-up time)

        # What an approval would cover.
        for line in glimpse_lines(run.run_id, approval.preview(store, run)):
            click.echo(line)  # notifications as stored; its advice line completed
    if fmt == "table" and every_item and not states:
        _every_item(store, run)


def _every_item(store: Store, run: Run) -> None:
    """The report table's last part: every item of the run, a line each, as stored (who got
    it, who might have, who never will), read as it is written."""
    whole = report.build(store, run)
    try:
        for line in report.item_lines(whole):
            click.echo(line)  # the items as stored
    finally:
        getattr(whole["items"], "close", lambda: None)()


def _console() -> Console:
    """Tables for people: on a pipe (no terminal width to honour) wide enough not to fold
    run ids and keys. Markup and emoji codes are off: item ids, evidence, file names and
    error texts come from users and downstreams, and `[/x]` or `:fire:` in one of them must
    print as written, not as a tag or an emoji."""
    from rich.console import Console  # noqa: PLC0415 (start-up time)

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """rich would exit 1 at once; a closed pipe has one rule, in NotifierGroup.invoke."""
            self.quiet = True
            raise BrokenPipeError

    if sys.stdout.isatty():
        return _Console(markup=False, emoji=False)
    return _Console(width=200, markup=False, emoji=False)


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
        console = _console()
        if report.render_table(data, console):
            console.print(
                suggesting(
                    f"(idempotency keys: `notifier report {data['run_id']} --format csv`, or a "
                    f"terminal at least {report.KEY_COLUMN_MIN_WIDTH} columns wide)"
                )
            )
        report.render_decisions(data, console)


@cli.command()
@json_flag("One JSON object: every run, newest first.")
@click.pass_context
def runs(ctx: click.Context, as_json: bool) -> None:
    """List every run in the database, newest first, with the channels it sends through.

    \b
    Examples:
      notifier runs
      notifier runs --json | jq -r '.runs[] | select(.state == "paused") | .run_id'
    """
    env = command_env(ctx, machine_output=as_json)
    store = open_store(env, readonly=True)
    try:
        from notifier.store.drafts import run_counts  # noqa: PLC0415 (start-up time)

        listed = [
            (run, report.effective_state(store, run).value, run_counts(store, run))
            for run in store.core.runs()
        ]
    finally:
        store.close()
    if as_json:
        records = [
            {
                "run_id": run.run_id,
                "state": state,
                "created_at": run.created_at,
                "channels": sorted(run.channel_snapshot),
                "approval_expired_at": approval.lapsed(run),
                "counts": c.as_json(),
                # Added to the contract's keys, as in `report`: the failed split into rows
                # never delivered and rows an operator abandoned (maybe delivered).
                "failed_detail": c.failed_detail(),
                "batch": run.batch_path,
            }
            for run, state, c in listed
        ]
        click.echo(json.dumps({"runs": records}, ensure_ascii=False, indent=2))
        return
    from rich.table import Table  # noqa: PLC0415 (start-up time)

    table = Table(show_header=True, header_style="bold")
    for name in ("run", "state", "created"):
        table.add_column(name, no_wrap=True)  # ids are copied from here: never fold them
    table.add_column("channels", overflow="fold")
    for name in _COUNTED:
        table.add_column(name, justify="right")
    table.add_column("batch", overflow="fold")
    for run, state, c in listed:
        table.add_row(
            run.run_id,
            f"{state} (approval expired)" if approval.lapsed(run) else state,
            run.created_at[:19],
            ", ".join(sorted(run.channel_snapshot)),
            *(_counted(c, name) for name in _COUNTED),
            run.batch_path,
        )
    _console().print(table)


# The table's count columns: every item in exactly one of them. An item in flight is never
# pending: its request may have been delivered (records.Counts.summary).
_COUNTED = ("total", "sent", "in_flight", "unknown", "pending", "failed", "expired", "suppressed")


def _counted(counts: Counts, name: str) -> str:
    """A count column's cell: the failed name those an operator abandoned (maybe delivered)."""
    if name == "failed" and counts.abandoned:
        return f"{counts.failed} ({counts.abandoned} abandoned)"
    return str(getattr(counts, name))


@cli.command()
@click.argument("run_id", required=False)
@click.option(
    "--report", "with_report", is_flag=True, help="Print the report when done (--json implies it)."
)
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
    ctx: click.Context,
    run_id: str | None,
    with_report: bool,
    fmt: str,
    as_json: bool,
    wait_s: float,
) -> None:
    """Stop dispatch now, settle in-flight items, and mark the run cancelled.

    \b
    Examples:
      notifier cancel                        # the newest unfinished run
      notifier cancel RUN --report --format csv > who-got-it.csv
      notifier cancel RUN --json > who-got-it.json
    """
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)
    from notifier.cli.outcome import settled_exit, unknown_advice  # noqa: PLC0415

    fmt = chosen_format(ctx, fmt, as_json)
    with_report = with_report or as_json  # a JSON document on stdout is the report
    env = command_env(ctx, machine_output=with_report and fmt != "table")
    api = Notifier(env)
    result = api.cancel(run_id, wait_s=wait_s)
    chunks_open = 0  # batch chunks the API could not be asked about: cancel again
    if result.run.options.get("compose") and result.run.state is RunState.CANCELLED:
        left = api.cancel_open_batches(result.run.run_id)  # left by drafting
        _say_batches_left_open(env.say, result.run.run_id, left)
        chunks_open = left.count
    advice = ""
    if not result.confirmed:
        rid = result.run.run_id
        advice = (
            f" Check with `notifier status {rid}`, or wait longer with `notifier cancel {rid} "
            "--wait 120`."
        )
    elif result.run.state is RunState.CANCELLED and result.counts.unknown:
        advice = " " + unknown_advice(
            result.run.run_id, result.counts.unknown, result.settle_later, result.marks_from
        )
    env.say(result.message + advice)
    if with_report:
        store = open_store(env)
        try:
            with store.reading():  # one moment, as `report` (a worker may still record)
                run = store.core.get_run(result.run.run_id)
                _emit(report.build(store, run, attention_only=fmt == "table"), fmt)
                if fmt == "table":  # the report, as `notifier report` prints it: every item
                    _every_item(store, run)
        finally:
            store.close()
    if not result.confirmed or chunks_open:
        ctx.exit(ExitCode.ATTENTION)
    ctx.exit(settled_exit(result.run.state, result.counts))


def _say_batches_left_open(say: Callable[[str], None], rid: str, left: BatchesLeftOpen) -> None:
    """The batch chunks a cancel left open, each with the cancel that finishes it."""
    from notifier.content.compose import KEY_ENV  # noqa: PLC0415 (start-up time)

    for chunk in left.unasked:
        say(f"{chunk}; run `notifier cancel {rid}` again once the API can be reached.")
    if left.not_looked_up:
        say(
            f"run {rid}: {left.not_looked_up} batch chunk(s) may still be running with the "
            f"Message Batches API, but {KEY_ENV} is not set, so they could not be looked up "
            "or cancelled; they stay open and nothing is claimed about them. Export "
            f"{KEY_ENV} and run `notifier cancel {rid}` again."
        )


@cli.command()
@click.argument("run_id", required=False)
@click.option("--manual", is_flag=True, help="Settle unknown items by hand, with evidence.")
@click.option("--item", "item_ref", help="With --manual: the item id to settle.")
@click.option(
    "--mark", type=click.Choice(["sent", "not-sent", "abandon"]), help="With --item: the decision."
)
@click.option("--evidence", help="With --item: what the decision rests on.")
@json_flag("Print the result (the run, its state and counts) as one JSON object.")
@click.pass_context
def reconcile(
    ctx: click.Context,
    run_id: str | None,
    manual: bool,
    item_ref: str | None,
    mark: str | None,
    evidence: str | None,
    as_json: bool,
) -> None:
    """Settle in-flight and unknown items by query, or by hand with --manual.

    \b
    The marks of --manual:
      sent      it was delivered (say how you know): recorded sent, never sent again
      not-sent  it was not delivered: sent again (same key) by resume, or, once the run
                is finished, by sending the same file again
      abandon   you cannot tell: failed, but maybe delivered, so it is never sent again
                unless you later mark it not-sent (allowed on an abandoned item)

    \b
    Examples:
      notifier reconcile                      # ask the channels about every open item
      notifier reconcile RUN --json           # the same, the result as JSON
      notifier reconcile --manual             # decide each unknown item at a prompt
      notifier reconcile RUN --manual --item n-0041 --mark not-sent --evidence "bounced"
    """
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)
    from notifier.cli.manual import reconcile_manually  # noqa: PLC0415
    from notifier.cli.outcome import settled_exit  # noqa: PLC0415

    env = command_env(ctx, machine_output=as_json)
    if not manual:
        if item_ref or mark or evidence:
            raise BadInput("--item, --mark and --evidence go with --manual.")
        reconciled = Notifier(env).reconcile(run_id)
        run, counts, shown = reconciled.run, reconciled.counts, reconciled.shown
        if reconciled.unqueryable:
            names = ", ".join(sorted(reconciled.unqueryable))
            env.say(
                f"{sum(reconciled.unqueryable.values())} unknown item(s) on channel(s) {names}, "
                "which cannot be asked whether a message arrived (SMTP, Apprise and a webhook "
                "without a status_url answer no such query): there is nothing "
                "`notifier reconcile` can settle for them by "
                "query. Check the recipients' side, then settle each by hand with "
                f"`notifier reconcile --manual {run.run_id}`."
            )
        if not as_json:
            echo(f"run {run.run_id}: {shown.value}")
        if shown is RunState.PAUSED and counts.pending and run.cancel_requested_at is None:
            # Rows it proved undelivered (or left unsent) wait in a run nobody works now.
            from notifier.cli.outcome import renew_approval  # noqa: PLC0415 (start-up time)

            rid = run.run_id
            env.say(
                f"{counts.pending} item(s) of run {rid} wait to be sent, and nothing sends them "
                "until the run goes on: "
                + (
                    f"once its expired approval is renewed ({renew_approval(rid)}), they are sent."
                    if approval.lapsed(run)
                    else f"`notifier resume {rid}` sends them."
                )
            )
    else:
        if as_json and item_ref is None:
            raise BadInput(
                "--json with --manual needs the decision on the command line (its prompts "
                "would mix with the JSON): `notifier reconcile RUN --manual --item ID --mark "
                "sent|not-sent|abandon --evidence TEXT --json`; nothing was changed."
            )
        run, counts, shown = reconcile_manually(env, run_id, item_ref, mark, evidence)
    if as_json:
        result = {"run_id": run.run_id, "state": shown.value, "counts": counts.as_json()}
        click.echo(json.dumps(result, ensure_ascii=False, indent=2))
    ctx.exit(settled_exit(run.state, counts))
