"""User-facing failures, each carrying the exit code of the CLI contract (DESIGN section 8)."""

from __future__ import annotations

import click


class BadInput(click.ClickException):
    """Usage or bad input; nothing was changed."""

    exit_code = 2


class NeedsAttention(click.ClickException):
    """Stopped with items needing attention, or paused by a long Retry-After."""

    exit_code = 3


class Refused(click.ClickException):
    """Refused for safety: a live lease, a conflict, a failed integrity check."""

    exit_code = 4
