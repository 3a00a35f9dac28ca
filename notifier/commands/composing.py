"""What `send --compose` shows on the command line before anything is stored: the brief it
reads and, for a dry run, the first drafts (which the API bills)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import BadInput

if TYPE_CHECKING:
    from .. import compose
    from ..batch import BatchRow
    from ..template import Template


def read_brief(path: Path) -> str:
    brief = path.read_text("utf-8").strip()
    if not brief:
        raise BadInput(f"{path}: the brief is empty: say what the notifications should say.")
    return brief


def dry_run_drafts(
    settings: compose.Settings, key: str, rows: list[BatchRow], template: Template | None
) -> None:
    from .. import claude, compose  # noqa: PLC0415 (the SDK loads only when drafting)

    count = min(len(rows), compose.DRY_RUN_ROWS)
    click.echo(
        f"dry run: drafting the first {count} of {len(rows)} rows with {settings.model} to show "
        "them (billed to the key in the environment; rehearse for free against `notifier "
        "sandbox`, see README)."
    )
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
