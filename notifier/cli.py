"""The `notifier` command line, assembled: the group (notifier/commands/group.py: global
options and the one place where failures become exit codes) with every command of
notifier/commands, one module per concern; each parses its options, calls app.py and renders.

A command imports what only it uses (app.py and all that sending needs, the sandbox's HTTP
server) when it runs, so that `status`, `report` and `runs` start fast.
"""

from __future__ import annotations

# Each module adds its commands to `cli` as it is imported: importing them is assembling.
from .commands import approval, export, observing, operator, resume, sandbox, send, suppress, verify
from .commands.group import cli

__all__ = [
    "approval",
    "cli",
    "export",
    "main",
    "observing",
    "operator",
    "resume",
    "sandbox",
    "send",
    "suppress",
    "verify",
]


def main() -> None:
    cli(prog_name="notifier")


if __name__ == "__main__":  # pragma: no cover
    main()
