"""The `notifier` click group, its global options, and the one place where failures become
exit codes. Every module of notifier/cli adds its commands to `cli` here; cli/__init__.py imports
them all and is what runs. The group sits below the commands, so that no command imports the
module that imports it.

Exit codes (docs/design.md sections 7 and 11): 0 done; 1 internal error; 2 usage or bad input
(nothing changed); 3 stopped with items needing attention or paused; 4 refused for safety; 130
interrupted; 137 simulated crash.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from notifier.api.env import Env
from notifier.config import load as load_config
from notifier.domain.errors import ExitCode, NotifierError
from notifier.store import NotADatabasePath, parse_target


@functools.cache
def _exception_for(code: ExitCode) -> type[click.ClickException]:
    """A click exception class that exits with `code` (click reads exit_code from the class)."""
    return type(f"Exit{int(code)}", (click.ClickException,), {"exit_code": int(code)})


def _Failure(message: str, code: ExitCode) -> click.ClickException:
    """A failure on its way out: click prints its message and exits with `code`."""
    return _exception_for(code)(message)


class _JsonFailure(click.ClickException):
    """A failure of a command run with --log-format json: said as one more JSON event on
    stderr (`error`, with the exit code and the message), not as prose a log pipeline
    cannot parse."""

    bodies = False  # --log-bodies: the log may carry recipients

    def show(self, file: Any = None) -> None:
        _log_event("error", self.message, bodies=self.bodies, exit_code=self.exit_code)


def _log_event(event: str, message: str, *, bodies: bool, **fields: Any) -> None:
    """One JSON event on stderr saying `message`, after `fields`. No line of the log carries
    a recipient without --log-bodies (observe/logs.py): a refused file's message quotes its
    bad `to` cells, named here by their lines alone."""
    from notifier.observe.logs import json_line  # noqa: PLC0415 (start-up time)

    text = message if bodies else _ADDRESS.sub("<recipient>", message)
    click.echo(json_line(event, {**fields, "message": text}), err=True)


# Anything spelt like an e-mail address (local@domain.tld), as a `to` cell may be.
_ADDRESS = re.compile(
    r"(?<![^\s'\"`<>(),;:\[\]])"  # whole: not the user part of a URL (scheme://user@host)
    r"[^\s'\"`<>(),;:\[\]/@]+@[^\s'\"`<>(),;:\[\]/@]+\.[A-Za-z][^\s'\"`<>(),;:\[\]/@]*"
)


@functools.cache
def _json_exception_for(code: ExitCode, bodies: bool = False) -> type[_JsonFailure]:
    """A _JsonFailure class that exits with `code` (click reads exit_code from the class)."""
    return type(f"JsonExit{int(code)}", (_JsonFailure,), {"exit_code": int(code), "bodies": bodies})


def _json_logs(args: list[str]) -> bool:
    """Whether the command line asks for JSON logs (`--log-format json` or `=json`)."""
    pairs = zip(args, [*args[1:], ""], strict=True)
    return any(a == "--log-format=json" or (a, b) == ("--log-format", "json") for a, b in pairs)


# Commands that only look at runs: one cut short by a reader that stopped reading (`notifier
# report | head`) has done what was asked of it.
_LOOKS = frozenset({"status", "report", "runs", "preview", "metrics"})


def _drop_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it once more on the way out, and on a pipe
    whose reader has gone that flush would fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # not a real file (a test's captured output): nothing will flush to a pipe


# The global options, each taking a value: accepted after the subcommand too (as `gh` and
# `llm` accept theirs), so `notifier status --db x.db` means what it says.
_GLOBAL_OPTIONS = ("--db", "--config")
_EXAMPLE_VALUE = {"--db": "receipts.db", "--config": "notifier.toml"}
# Those this process was given on its command line, as words every suggested command repeats.
_SUGGEST_WITH = "notifier.suggest_with"


def hoist_global_options(args: list[str]) -> list[str]:
    """`args` with every global option (and its value) that follows the subcommand moved to
    just before it, after any given before it (the later one wins, as click takes the last);
    what comes after a `--` is left alone (positional by convention)."""
    front: list[str] = []
    rest: list[str] = []
    command_seen = False
    command_at = len(args)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            rest.extend(args[i:])
            break
        name = word.split("=", 1)[0]
        if name in _GLOBAL_OPTIONS:
            taken = args[i : i + 1] if "=" in word else args[i : i + 2]
            if len(taken) == 1 and "=" not in word:
                # Hoisted alone, it would take the command itself for its value.
                raise click.UsageError(
                    f"{name} requires a value, e.g. `{name} {_EXAMPLE_VALUE[name]}`."
                )
            (front if command_seen else rest).extend(taken)
            i += len(taken)
            continue
        if not command_seen and not word.startswith("-"):
            command_seen, command_at = True, len(rest)
        rest.append(word)
        i += 1
    return rest[:command_at] + front + rest[command_at:]


class NotifierGroup(click.Group):
    """The one place where failures become exit codes: a NotifierError carries its own, a
    storage failure is named with its cause and fix, anything else is an internal error
    (exit 1) without a traceback unless NOTIFIER_DEBUG."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["json_errors"] = _json_logs(args)
        ctx.meta["json_bodies"] = "--log-bodies" in args
        return super().parse_args(ctx, hoist_global_options(args))

    def _failure(self, ctx: click.Context, message: str, code: ExitCode) -> click.ClickException:
        message = suggesting(message)
        if ctx.meta.get("json_errors"):
            return _json_exception_for(code, ctx.meta.get("json_bodies", False))(message)
        return _Failure(message, code)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except NotifierError as exc:
            from notifier.cli.outcome import error_message  # noqa: PLC0415 (start-up time)

            raise self._failure(
                ctx, error_message(exc, ctx.invoked_subcommand), exc.exit_code
            ) from exc
        except KeyboardInterrupt as exc:
            # Ctrl-C outside the places that say more (planning, sending, drafting, manual
            # decisions): click would print "Aborted!" and exit 1, as if something broke.
            from notifier.cli.outcome import SENDING_COMMANDS  # noqa: PLC0415 (start-up time)

            then = (
                "`notifier resume` continues it"
                if ctx.invoked_subcommand in SENDING_COMMANDS
                # A cancel cut short may not have been recorded: resuming would send the run.
                else "run the same command again if it still applies"
            )
            raise self._failure(
                ctx,
                "interrupted (Ctrl-C). Every change already made is durable: `notifier "
                f"status` shows where the run stands; {then}.",
                ExitCode.INTERRUPTED,
            ) from exc
        except BrokenPipeError as exc:
            _drop_stdout()
            if ctx.invoked_subcommand in _LOOKS:
                raise click.exceptions.Exit(0) from exc  # `| head` had what it wanted
            raise self._failure(
                ctx,
                "the output was closed before notifier had written all of it (a pipe into "
                "`head`?). What the command did is durable: `notifier status` shows where "
                "the run stands, and `notifier resume` continues it if it did not finish.",
                ExitCode.INTERNAL,
            ) from exc
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
                _drop_stdout()  # its last flush at exit would fail again
                raise self._output_cut_short(ctx, exc) from exc
            # A read outside any write (a report's rows) meets a damaged database here.
            if (damaged := _damage(ctx, exc)) is not None:
                from notifier.cli.outcome import error_message  # noqa: PLC0415 (start-up time)

                raise self._failure(ctx, error_message(damaged), damaged.exit_code) from exc
            if os.environ.get("NOTIFIER_DEBUG"):
                traceback.print_exc()
            raise self._failure(
                ctx,
                f"internal error: {type(exc).__name__}: {exc}. Nothing was lost: every "
                "state change is durable; `notifier status` shows where the run stands. "
                "Set NOTIFIER_DEBUG=1 for a traceback.",
                ExitCode.INTERNAL,
            ) from exc

    def _output_cut_short(self, ctx: click.Context, exc: OSError) -> click.ClickException:
        """A write that found its disk full, not the database's (the store names its own,
        and the run is paused) nor a file named by an option (output.unwritable): the
        command's own output, stdout redirected to a file (`notifier metrics >
        notifier.prom`). The contract's full disk is exit 3, never an internal error, and
        what the command wrote there is cut short."""
        from notifier.cli.outcome import SENDING_COMMANDS  # noqa: PLC0415 (start-up time)

        then = (
            "`notifier status` shows where the run stands and `notifier resume` continues it"
            if ctx.invoked_subcommand in SENDING_COMMANDS
            else "then run the same command again"
        )
        return self._failure(
            ctx,
            f"the disk notifier was writing its output to is full ({exc.strerror or exc}), so "
            "that output is incomplete. Every change already made is durable. Free space on "
            f"that disk (or write the output elsewhere); {then}.",
            ExitCode.ATTENTION,
        )


# A write refused for want of room: the disk full, or the user's quota spent.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _damage(ctx: click.Context, exc: Exception) -> NotifierError | None:
    """The damaged database `exc` shows, as the store of --db names it; None otherwise."""
    try:
        return parse_target(ctx.params["db"]).damage(exc)
    except Exception:  # a --db that parses to no database met no damage of one
        return None


@click.group(cls=NotifierGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    given: list[str] = []
    if ctx.get_parameter_source("db") is ParameterSource.COMMANDLINE:
        given += ["--db", db]
    if config_path is not None:  # no environment variable: given on the command line
        given += ["--config", str(config_path)]
    ctx.meta[_SUGGEST_WITH] = shlex.join(given)


def command_env(ctx: click.Context, *, machine_output: bool = False) -> Env:
    """With `machine_output` (JSON or CSV on stdout), running commentary goes to stderr."""
    explicit = ctx.obj["config"] is not None
    config = load_config(ctx.obj["config"] or Path("notifier.toml"), explicit=explicit)
    return Env(target=ctx.obj["db"], config=config, say=say_err if machine_output else say)


def suggesting(text: str) -> str:
    """`text` with every command it suggests (`notifier …`, in backticks) given the --db and
    --config this process was given on its command line: followed word for word, it works on
    the same run with the same channels. Without them a suggested `notifier send BATCH.csv`
    would plan the file again in ./receipts.db, which records none of the run's deliveries,
    and send every row a second time. (Given by NOTIFIER_DB, the database is the shell's own
    and needs no repeating.)"""
    ctx = click.get_current_context(silent=True)
    words = ctx.meta.get(_SUGGEST_WITH) if ctx is not None else None
    return text.replace("`notifier ", f"`notifier {words} ") if words else text


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """click.echo for the tool's own messages: the commands they suggest as `suggesting`
    gives them. What the tool shows of the data (a notification, a report's rows, an item's
    subject) and machine output (JSON, CSV, metrics) go out through click.echo as stored:
    a body that mentions `notifier status` is shown as it will be sent."""
    click.echo(suggesting(message), err=err, nl=nl)


def warn(message: str) -> None:
    """A warning (`message` starts "warning: ") on stderr; with --log-format json one more
    JSON event (`warning`), as a failure is an `error` event, never prose among the lines a
    log pipeline parses. Its addresses are left out as the failure's are."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or not ctx.meta.get("json_errors"):
        echo(message, err=True)
        return
    text = suggesting(message.removeprefix("warning: "))
    _log_event("warning", text, bodies=bool(ctx.meta.get("json_bodies", False)))


def say(line: str) -> None:
    echo(line)


def say_err(line: str) -> None:
    echo(line, err=True)
