"""`notifier export`: one run to a standalone SQLite file an auditor can search and check
offline (store/audit_file.py writes it, through the API); parse, call, render."""

from __future__ import annotations

import json
from pathlib import Path

import click

from notifier.cli.group import cli, command_env, echo
from notifier.cli.output import json_flag, unwritable
from notifier.domain.chain import KEY_ENV


@cli.command(name="export")
@click.argument("run_id", required=False)
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The new file to write (never an existing one).",
)
@click.option(
    "--with-bodies",
    is_flag=True,
    help="Include each notification's payload (subject, body). Left out by default: an "
    "audit rarely needs them, and they may hold personal data.",
)
@json_flag("Print one JSON object: the file, its rows per table and how it is sealed.")
@click.pass_context
def export_command(
    ctx: click.Context, run_id: str | None, to: Path, with_bodies: bool, as_json: bool
) -> None:
    """Write a run (default: the newest) to a standalone SQLite file for an auditor.

    The file holds the run, its items, attempts, receipts, manual decisions, its events with
    their chain, the approval record and the suppression entries that applied, each row
    sealed (HMAC-SHA256 under the audit key, NOTIFIER_AUDIT_KEY or [audit] key_file; plain
    SHA-256 without one), with a manifest of every table's digest and its signature. Items
    are searchable by id, recipient and receipt id (`sqlite-utils search audit.db items
    ann@example.com --quote`). Read-only on the database; streams, so a million-item run needs
    no more memory than a small one.

    \b
    Examples:
      notifier export RUN --to audit.db
      notifier export RUN --to audit.db --with-bodies --json
    """
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)

    env = command_env(ctx, machine_output=as_json)
    try:
        exported = Notifier(env).export(run_id, to, with_bodies=with_bodies)
    except OSError as exc:  # the new file (audit_file.export opens it before reading a row)
        raise unwritable(to, "--to", exc) from None
    if as_json:
        document = {
            "run_id": exported.run_id, "path": str(exported.path), "rows": exported.rows,
            "sealed": exported.kind, "key_id": exported.key_id,
            "with_bodies": exported.with_bodies,
        }  # fmt: skip
        click.echo(json.dumps(document, indent=2))
        return
    rows = exported.rows
    sealed = (
        f"sealed with audit key {exported.key_id}"
        if exported.key_id
        else f"sealed without a key ({KEY_ENV} unset): its seals show accidents, not an editor"
    )
    echo(
        f"exported run {exported.run_id} to {exported.path}: {rows['items']} items, "
        f"{rows['attempts']} attempts, {rows['receipts']} receipts, {rows['events']} events"
        f"{', with bodies' if exported.with_bodies else ''}; {sealed}. "
        f"`notifier verify {exported.path}` checks it."
    )
