"""The `notifier` command line, assembled: the group (notifier/cli/group.py: global
options and the one place where failures become exit codes) with every command of
notifier/cli, one module per concern; each parses its options, calls the API (notifier/api)
and renders.

A command imports what only it uses (the API and all that sending needs, the sandbox's HTTP
server) when it runs, so that `status`, `report` and `runs` start fast.
"""

from __future__ import annotations

# Each module adds its commands to `cli` as it is imported: importing them is assembling.
from notifier.cli import (
    exporting,
    operator,
    proving,
    resume,
    review,
    run_sandbox,
    send,
    suppress,
    watching,
)
from notifier.cli.group import cli

__all__ = [
    "cli",
    "exporting",
    "main",
    "operator",
    "proving",
    "resume",
    "review",
    "run_sandbox",
    "send",
    "suppress",
    "watching",
]


def main() -> None:
    cli(prog_name="notifier")


if __name__ == "__main__":  # pragma: no cover
    main()
