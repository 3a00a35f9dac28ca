"""`--json` on every command that lists or reports, as `gh` and `llm` offer it: one JSON
document on stdout, anything said along the way on stderr. Where a command also offers
`--format` (csv, jsonl or a table besides json), `--json` is `--format json` spelled short."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import click
from click.core import ParameterSource

from notifier.domain.errors import BadInput, NeedsAttention, NotifierError

F = TypeVar("F", bound=Callable[..., None])


def json_flag(help_text: str) -> Callable[[F], F]:
    """`--json` alone, for a command with no other format (its value is `as_json`)."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def format_options(choices: Sequence[str], help_text: str) -> Callable[[F], F]:
    """`--format CHOICE` (default table; its value is `fmt`) and `--json` (`as_json`), which
    the command reads back as one format through `chosen_format`."""

    def decorate(command: F) -> F:
        command = click.option(
            "--json", "as_json", is_flag=True, help="The same as --format json."
        )(command)
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(list(choices)),
            default="table",
            show_default=True,
            help=help_text,
        )(command)

    return decorate


def chosen_format(ctx: click.Context, fmt: str, as_json: bool) -> str:
    """The format asked for: `--json` is `--format json`; both given and disagreeing is a
    usage error (exit 2), never a guess at which one was meant."""
    if not as_json:
        return fmt
    if fmt != "json" and ctx.get_parameter_source("fmt") is ParameterSource.COMMANDLINE:
        raise BadInput(
            f"--json and --format {fmt} disagree (--json is --format json); nothing was done. "
            f"Give one of them, e.g. `{command_line(ctx)} --json` or "
            f"`{command_line(ctx)} --format {fmt}`."
        )
    return "json"


def command_line(ctx: click.Context) -> str:
    """`notifier` and the subcommands that lead to `ctx`, as an operator types them."""
    names: list[str] = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["notifier", *reversed(names)])


# The files SQLite keeps beside a database while it is open (write-ahead log, shared memory,
# rollback journal): writing over one loses committed transactions as surely as the file.
_SIDECARS = ("", "-wal", "-shm", "-journal")


def refuse_the_database(path: Path, option: str, db: object) -> None:
    """BadInput (exit 2) when `path`, a file a command is about to write, is the SQLite
    database `db` names (by any spelling: relative, absolute, through a link) or one of the
    files beside it: written over, every run and receipt in it would be lost."""
    from notifier.store.target import SqliteFile  # noqa: PLC0415 (start-up time)

    if not isinstance(db, SqliteFile):
        return
    database = db.path.resolve()
    written = path.resolve()
    for suffix in _SIDECARS:
        held = database.with_name(database.name + suffix)
        same = written == held
        if not same and written.exists() and held.exists():
            same = os.path.samefile(written, held)  # a hard link
        if same:
            raise BadInput(
                f"{option} {path} is the receipts database {db.path}"
                + (f" (its {suffix[1:]} file)" if suffix else "")
                + ": writing there would destroy every run and receipt in it. Give "
                f"{option} another file; the database was not changed."
            )


def unwritable(path: Path, option: str, exc: OSError) -> NotifierError:
    """A file a command writes (`option` names it) that could not be: its disk full is the
    contract's disk problem (exit 3, as for the database); any other cause (a directory that
    is not there, no permission) is bad input (exit 2). The database is not changed."""
    cause = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NeedsAttention(
            f"{path}: the disk is full ({cause}), so the file is incomplete. Free space on "
            "that disk, or give another path, then run the command again; the database was "
            "not changed."
        )
    return BadInput(
        f"{path} cannot be written ({cause}). Give {option} a file in a directory that exists "
        "and may be written to; the database was not changed."
    )
