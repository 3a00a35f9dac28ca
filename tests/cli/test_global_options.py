"""The command line's conventions: `--db` and `--config` before or after the subcommand,
`-h` as well as `--help` on every command, and arguments that start with a dash where an
address may."""

from __future__ import annotations

import re

import pytest

from notifier.cli.group import hoist_global_options

from ..conftest import Workspace, make_rows


def test_global_options_after_the_subcommand_move_in_front() -> None:
    assert hoist_global_options(["status", "--db", "x.db", "r1"]) == [
        "--db",
        "x.db",
        "status",
        "r1",
    ]
    assert hoist_global_options(["--db", "a.db", "send", "b.csv", "--config=c.toml"]) == [
        "--db", "a.db", "--config=c.toml", "send", "b.csv"
    ]  # fmt: skip
    # Given both before and after the subcommand, the one after comes last: it wins.
    assert hoist_global_options(["--db", "a.db", "status", "--db", "b.db"]) == [
        "--db", "a.db", "--db", "b.db", "status"
    ]  # fmt: skip
    # After `--`, a word is positional whatever it looks like.
    assert hoist_global_options(["suppress", "add", "--", "--db"]) == [
        "suppress",
        "add",
        "--",
        "--db",
    ]


def test_db_and_config_are_taken_after_the_subcommand(ws: Workspace) -> None:
    """`notifier send b.csv --db other.db --config c.toml` writes other.db through the
    channel c.toml defines; `status --db other.db` reads it."""
    (ws.path / "c.toml").write_text("[channels.mail]\ntype = 'outbox'\n")
    ws.write_csv("b.csv", make_rows(2))
    other = str(ws.path / "other.db")
    sent = ws.invoke("send", "b.csv", "--channel", "mail", "--db", other, "--config", "c.toml")
    assert sent.exit_code == 0, sent.output
    assert (ws.path / "other.db").exists() and not ws.db_file.exists()
    shown = ws.invoke("status", "--db", other, "--json")
    assert shown.exit_code == 0 and '"sent": 2' in shown.output


@pytest.mark.parametrize(
    "command",
    ["send", "resume", "status", "runs", "cancel", "report", "reconcile", "approve",
     "preview", "reject", "suppress", "metrics", "worker"],
)  # fmt: skip
def test_dash_h_is_help_on_every_command(ws: Workspace, command: str) -> None:
    """`-h` is `--help`; the commands an operator reaches for first show worked examples."""
    result = ws.invoke(command, "-h")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ") and f" {command} " in result.output.splitlines()[0]
    assert "-h, --help" in result.output
    if command in ("send", "resume", "cancel", "reconcile", "report", "runs"):
        assert re.search(rf"Examples:\n +notifier {command}", result.output), result.output


def test_an_address_that_starts_with_a_dash_needs_no_double_dash(ws: Workspace) -> None:
    added = ws.invoke("suppress", "add", "-dash@example.com", "--reason", "asked")
    assert added.exit_code == 0, added.output
    listed = ws.invoke("suppress", "list", "--format", "json").output
    assert '"-dash@example.com"' in listed
    assert ws.invoke("suppress", "remove", "-dash@example.com").exit_code == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "url",
    ["postgresql://[::1", "postgres://notifier@[::1/n", "postgresql://notifier@::1]:5432/n"],
)
def test_a_db_url_that_cannot_be_read_is_exit_2_naming_the_problem(ws: Workspace, url: str) -> None:
    """A postgresql:// URL that does not parse (an IPv6 host's bracket unclosed or unopened)
    is exit 2 naming --db and what is wrong with it; never an internal error."""
    result = ws.invoke("status", "--db", url)
    assert result.exit_code == 2, result.output
    assert "--db" in result.output and "URL" in result.output, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("option", ["--db", "--config"])
def test_a_global_option_given_last_without_its_value_is_named(ws: Workspace, option: str) -> None:
    """`notifier status --db` (the value forgotten) is exit 2 naming the option that needs
    one, never the command taken for its value ("Missing command")."""
    result = ws.invoke("status", option)
    assert result.exit_code == 2, result.output
    assert option in result.output and "requires a value" in result.output, result.output
