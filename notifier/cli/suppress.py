"""`notifier suppress add|import|list|remove`: the suppression list, kept in the
database beside the runs (both engines), every change audited with the operator and time.
A row whose recipient is on the list is planned `suppressed` and never sent."""

from __future__ import annotations

import csv
import io
import json
import shlex
from pathlib import Path

import click

from notifier.api.env import open_store
from notifier.cli.group import cli, command_env, echo
from notifier.cli.output import chosen_format, format_options
from notifier.domain.cells import cell_value
from notifier.domain.errors import BadInput
from notifier.domain.redact import literal
from notifier.domain.suppression import (
    Entry,
    Source,
    address_key,
    address_keys,
    address_problem,
    reason_problem,
)
from notifier.domain.who import operator_name


@cli.group()
def suppress() -> None:
    """The suppression list: addresses never sent to (bounced, unsubscribed, complained)."""


class _AddressesCommand(click.Command):
    """A command whose arguments are addresses, one of which may start with `-`
    (-dash@example.com): a word that starts with `-` and holds an `@` is an address, never
    a bundle of short options (where its `h` would be -h, help), so it needs no `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            return super().parse_args(ctx, args)
        dashed = [a for a in args if a.startswith("-") and not a.startswith("--") and "@" in a]
        rest = [a for a in args if a not in dashed]
        return super().parse_args(ctx, [*rest, "--", *dashed] if dashed else rest)


@suppress.command("add", cls=_AddressesCommand)
@click.argument("addresses", nargs=-1, required=True)
@click.option("--reason", help="Why, kept with each address (e.g. 'asked to stop').")
@click.pass_context
def add(ctx: click.Context, addresses: tuple[str, ...], reason: str | None) -> None:
    """Suppress ADDRESS… (case does not matter: Ann@Example.com is ann@example.com)."""
    if reason is not None and (problem := reason_problem(reason)) is not None:
        raise BadInput(
            f"suppress add: --reason {problem}; give a shorter one on one line, e.g. "
            "--reason 'asked to stop'. Nothing was stored."
        )
    found = entries(list(addresses), reason.strip() or None if reason else None)
    _store_entries(ctx, found, Source.OPERATOR)


@suppress.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def import_(ctx: click.Context, file: Path) -> None:
    """Suppress every address in FILE.csv: a column `address` (or `email`, else the first
    column), and an optional `reason` column. A file with a bad line stores nothing."""
    _store_entries(ctx, read_import(file), Source.IMPORT)


def _store_entries(ctx: click.Context, found: list[Entry], source: Source) -> None:
    """Put `found` on the list in one transaction and say how many were new."""
    store = open_store(command_env(ctx), create=True)
    try:
        added = store.suppressions.suppress(found, source, operator_name())
    finally:
        store.close()
    already = len(found) - len(added)
    line = f"suppressed {len(added)} address(es)"
    if already:
        line += f"; {already} already on the list (kept as they were)"
    echo(line + ". `notifier suppress list` shows the list.")


@suppress.command("list")
@format_options(("table", "json", "csv"), "csv reads back with `notifier suppress import`.")
@click.pass_context
def list_(ctx: click.Context, fmt: str, as_json: bool) -> None:
    """Every suppressed address, with its reason, source, operator and time."""
    fmt = chosen_format(ctx, fmt, as_json)
    store = open_store(command_env(ctx, machine_output=fmt != "table"), readonly=True)
    try:
        rows = store.suppressions.suppressions()
    finally:
        store.close()
    names = ("address", "reason", "source", "operator", "created_at")
    records = [
        {
            "address": s.address,
            "reason": s.reason,
            "source": s.source.value,
            "operator": s.operator,
            "created_at": s.created_at,
        }
        for s in rows
    ]
    if fmt == "json":
        click.echo(json.dumps({"suppressions": records}, ensure_ascii=False, indent=2))
        return
    if fmt == "csv":
        from notifier.domain.cells import safe_cell  # noqa: PLC0415 (start-up time)

        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(names)
        for record in records:
            writer.writerow([safe_cell(record[name]) for name in names])
        click.echo(buffer.getvalue(), nl=False)
        return
    if not records:
        echo("the suppression list is empty.")
        return
    from rich.table import Table  # noqa: PLC0415 (start-up time)

    from notifier.cli.operator import _console  # noqa: PLC0415

    table = Table(show_header=True, header_style="bold")
    for name in names:
        table.add_column(name, overflow="fold")
    for record in records:
        # literal: a reason stored before control characters were refused is shown, never
        # acted on by the terminal.
        table.add_row(*(literal(str(record[name] or "")) for name in names))
    _console().print(table)
    echo(f"{len(records)} suppressed address(es).")


@suppress.command("remove", cls=_AddressesCommand)
@click.argument("addresses", nargs=-1, required=True)
@click.pass_context
def remove(ctx: click.Context, addresses: tuple[str, ...]) -> None:
    """Take ADDRESS… off the list: later runs send to them again."""
    keys = list(dict.fromkeys(address_key(a) for a in addresses))
    # An address is on the list under every spelling of its domain (address_keys): each
    # entry a row would be matched by goes, whichever spelling the operator gives.
    spellings = {key: address_keys(key) for key in keys}
    store = open_store(command_env(ctx))
    try:
        taken = set(
            store.suppressions.unsuppress(
                list(dict.fromkeys(k for key in keys for k in spellings[key])), operator_name()
            )
        )
    finally:
        store.close()
    removed = [key for key in keys if taken.intersection(spellings[key])]
    line = f"removed {len(removed)} address(es) from the suppression list"
    absent = [k for k in keys if k not in removed]
    if absent:
        line += f"; not on it: {', '.join(absent)}"
    echo(line + ".")


def entries(addresses: list[str], reason: str | None) -> list[Entry]:
    """The command line's ADDRESS… as entries; BadInput naming every bad one."""
    bad = [f"{a!r} {p}" for a in addresses if (p := address_problem(a)) is not None]
    if bad:
        raise BadInput(
            "suppress: " + "; ".join(bad) + ". Give each address as local@domain, e.g. "
            "`notifier suppress add ann@example.com --reason 'asked to stop'`; nothing "
            "was stored."
        )
    return [Entry(address_key(a), reason) for a in dict.fromkeys(addresses)]


_ADDRESS_COLUMNS = ("address", "email")


def read_import(path: Path) -> list[Entry]:
    """The entries of an import file: a CSV whose address column is named `address` or
    `email` (else the first column, the first line then being data when it holds an `@`,
    as no header does), with an optional `reason` column. BadInput naming every bad line: a file is
    imported whole or not at all."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise BadInput(
            f"suppress import: {path} does not exist. Give a CSV file with a column "
            "`address` (or `email`), e.g. `notifier suppress import bounced.csv`."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(
            f"suppress import: {path} cannot be read as UTF-8 text ({exc}). Save it as a "
            f"UTF-8 CSV file and run {_again(path)} again; nothing was stored."
        ) from None
    numbered = _records(path, text)
    rows = [row for _, row in numbered]
    if not rows:
        raise BadInput(
            f"suppress import: {path} is empty. It needs a column `address` (or `email`) "
            "with one address per line; nothing was stored."
        )
    header = [cell.strip().lower() for cell in rows[0]]
    twice = [n for n in (*_ADDRESS_COLUMNS, "reason") if header.count(n) > 1]
    if twice:
        columns = ", ".join(str(i + 1) for i, n in enumerate(header) if n == twice[0])
        raise BadInput(
            f"suppress import: {path} line 1 names the column `{twice[0]}` more than once "
            f"(columns {columns}): only one would be read, and the addresses in the others "
            "would not be suppressed. Merge them into one column (or rename the others) and "
            f"run {_again(path)} again; nothing was stored."
        )
    column = next((header.index(n) for n in _ADDRESS_COLUMNS if n in header), None)
    reason_column = header.index("reason") if "reason" in header else None
    first_data = 1
    if column is None:
        column = 0
        # No named column: the first line is data when it holds an `@` (no header does),
        # and is then checked as every line is: a mistyped first address taken for a header
        # would be left out while the rest was stored, its owner still mailed.
        first_data = 0 if rows[0] and "@" in rows[0][0] else 1
    found: list[Entry] = []
    problems: list[str] = []
    for line, row in numbered[first_data:]:
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        address = row[column] if column < len(row) else ""
        problem = address_problem(address)
        if problem is not None:
            problems.append(f"line {line}: {address!r} {problem}")
            continue
        reason = (
            row[reason_column].strip()
            if reason_column is not None and reason_column < len(row)
            else ""
        )
        if (why := reason_problem(reason)) is not None:
            problems.append(f"line {line}: the reason {why}")
            continue
        found.append(Entry(address_key(address), reason or None))
    if problems:
        shown = "; ".join(problems[:20])
        more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise BadInput(
            f"suppress import: {path} has {len(problems)} bad line(s): {shown}{more}. Fix "
            f"them (each line one address, local@domain) and run {_again(path)} again; "
            "nothing was stored."
        )
    if not found:
        raise BadInput(
            f"suppress import: {path} holds no address. It needs a column `address` (or "
            "`email`) with one address per line; nothing was stored."
        )
    return list({e.address: e for e in found}.values())


def _again(path: Path) -> str:
    """The import to run once its file is mended, as the operator types it."""
    return f"`notifier suppress import {shlex.quote(str(path))}`"


def _records(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """The import file's records, each with the line of the file it starts on (as an editor
    numbers it: a cell may span lines), trailing blank ones dropped. Read strictly:
    leniently, a quote opened and never closed makes every later line part of its cell,
    and the addresses on them would be left out while the import said it succeeded."""
    numbered: list[tuple[int, list[str]]] = []
    reader = csv.reader(io.StringIO(text), strict=True)
    start = 1
    try:
        for record in reader:
            # `suppress list --format csv` escapes formula-like cells; reading back undoes it.
            numbered.append((start, [cell_value(c) for c in record]))
            start = reader.line_num + 1
    except csv.Error as exc:  # a quote left open or misplaced, or a cell past the limit
        raise BadInput(
            f"suppress import: {path} line {start} is not CSV that can be read ({exc}): "
            "close every quote that is opened, and double a quote inside a quoted cell "
            f'(""), then run {_again(path)} again; nothing was stored.'
        ) from None
    while numbered and not any(cell.strip() for cell in numbered[-1][1]):
        numbered.pop()
    return numbered
