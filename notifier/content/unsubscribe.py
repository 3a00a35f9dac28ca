"""One-click unsubscribe (RFC 8058) in a batch file: the optional `unsubscribe_url` (https)
and `unsubscribe_mailto` columns, checked when planning (intent.py says what each may hold,
as digested), and the channels that require one on every row (`require_unsubscribe`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from notifier.domain.intent import unsubscribe_mailto, unsubscribe_url

COLUMNS = ("unsubscribe_url", "unsubscribe_mailto")


def required(definitions: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The channels (`require_unsubscribe = true`) whose every row needs an address."""
    return frozenset(
        name for name, definition in definitions.items() if definition.get("require_unsubscribe")
    )


def row_unsubscribe(
    url_cell: str, mailto_cell: str, channel: str, must: bool
) -> tuple[str | None, str | None, list[str]]:
    """A row's URL and mailto: URI as its intent holds them (None: empty cell), and the
    problems with them, each naming the column and the fix."""
    found: list[str | None] = []
    problems: list[str] = []
    for text, column, normalise in (
        (url_cell, "unsubscribe_url", unsubscribe_url),
        (mailto_cell, "unsubscribe_mailto", unsubscribe_mailto),
    ):
        if not text.strip():
            found.append(None)
            continue
        try:
            found.append(normalise(text))
        except ValueError as exc:
            problems.append(f"`{column}` {text.strip()[:80]!r} {exc}")
            found.append(None)
    url, mailto = found
    if must and not problems and url is None and mailto is None:
        problems.append(
            f"no unsubscribe address, which channel {channel!r} requires "
            "(require_unsubscribe = true): fill in `unsubscribe_url` (https) or "
            "`unsubscribe_mailto`, or set require_unsubscribe = false"
        )
    return url, mailto, problems
