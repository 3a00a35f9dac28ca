"""CSV cells a spreadsheet shows as text, and read back as they were.

A spreadsheet runs a cell that starts with a formula character as a formula (CSV
injection), so every CSV that notifier writes (reports, previews, the suppression list)
neutralises it with a leading apostrophe. A value that itself starts with an apostrophe gets
one more (a spreadsheet hides the first), which makes the escape reversible: what `suppress
list --format csv` writes, `suppress import` reads back exactly."""

from __future__ import annotations

from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_ESCAPED_START = (*FORMULA_START, "'")


def safe_cell(value: Any) -> str:
    """`value` as a cell a spreadsheet shows as text."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_ESCAPED_START) else text


def cell_value(cell: str) -> str:
    """The value `safe_cell` wrote `cell` for: its added apostrophe taken off. A cell from
    elsewhere that starts with one apostrophe before an ordinary character keeps it."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(_ESCAPED_START) else cell
