"""Every command and subcommand answers `-h` as it answers `--help`, and the help of `send`,
`resume`, `cancel`, `reconcile` and `report` shows an "Examples:" block whose every line is
a command that command would accept (its options exist, take the values given, and the
positional arguments fit)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from notifier.cli import cli

WITH_EXAMPLES = ("send", "resume", "cancel", "reconcile", "report", "verify", "export")


def every_command(
    group: click.Group = cli, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from every_command(command, (*path, name))


COMMANDS = dict(every_command())


def help_of(path: tuple[str, ...], flag: str) -> str:
    result = CliRunner().invoke(cli, [*path, flag], prog_name="notifier")
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_walk_finds_every_command_and_subcommand() -> None:
    """A guard on the walk itself: the commands of the contract, `suppress`'s included."""
    assert {"send", "resume", "status", "runs", "cancel", "reconcile", "report"} <= {
        p[0] for p in COMMANDS
    }
    assert {("suppress", n) for n in ("add", "import", "list", "remove")} <= set(COMMANDS)


def test_the_group_takes_dash_h() -> None:
    assert help_of((), "-h") == help_of((), "--help")


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_command_takes_dash_h(path: tuple[str, ...]) -> None:
    text = help_of(path, "-h")
    assert text.startswith(f"Usage: notifier {' '.join(path)} ")
    assert text == help_of(path, "--help")
    assert "-h, --help" in text


def examples(text: str) -> list[str]:
    """The command lines of the help's "Examples:" block (comments and pipes cut off)."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.strip() == "Examples:") + 1
    found = []
    for line in lines[start:]:
        if not line.strip():
            break
        found.append(line.strip())
    return found


def parse_example(line: str) -> None:
    """Parse `line` as the command it names would: AssertionError or click's UsageError
    when an option does not exist, lacks its value or is given a value it refuses, or when
    the positional arguments do not fit. Paths are not looked up: an example names files
    the reader has, not files this test has."""
    words = shlex.split(line, comments=True)
    for cut in ("|", ">", "&&"):
        if cut in words:
            words = words[: words.index(cut)]
    assert words[0] == "notifier", line
    path = tuple(w for w in words[1:3] if not w.startswith("-"))
    while path not in COMMANDS:
        path = path[:-1]
        assert path, f"{line!r} names no command"
    command = COMMANDS[path]
    ctx = click.Context(command, info_name=path[-1])
    values, rest, order = command.make_parser(ctx).parse_args(words[1 + len(path) :])
    assert rest == [], f"{line!r}: {rest} left over"
    for param in order:
        if param.name in values and not isinstance(param.type, click.Path):
            param.type_cast_value(ctx, values[param.name])


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_the_examples_are_commands_that_parse(name: str) -> None:
    found = examples(help_of((name,), "-h"))
    assert len(found) >= 2, found
    for line in found:
        assert line.startswith(f"notifier {name}"), line
        parse_example(line)


@pytest.mark.parametrize(
    "line",
    [
        "notifier report RUN --fromat json",  # a misspelt option
        "notifier report RUN --format xml",  # a value the option refuses
        "notifier cancel RUN OTHER",  # one positional argument too many
        "notifier resume RUN --concurrency",  # an option without its value
        "notifier send b.csv --concurrency 0",  # out of range
    ],
)
def test_a_wrong_example_would_be_caught(line: str) -> None:
    """A guard on the check itself: each of these fails it."""
    with pytest.raises((click.UsageError, AssertionError)):
        parse_example(line)
