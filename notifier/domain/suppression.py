"""The suppression list: addresses that are never sent to, whatever a batch says.

An address is kept under its key: the intent's normalisation of a target (NFC, trimmed,
domain lower-cased: intent.normalise_target) with the local part lower-cased too, so that
`Ann@Example.com` and `ann@example.com` are one address. The intent keeps the local part's
case (RFC 5321 lets a mailbox tell them apart, and the digest must not change); a
suppression errs the other way, because mailing an address its owner asked to stop is the
mistake that costs, and no real mailbox is told apart by case alone.

Where a row is matched: at plan time by SQL (store/suppressions.py, one pass over the new
items, with the database lower-casing ASCII letters only, the same on both engines), and
again at the claim by this module's `address_key`, which also lower-cases non-ASCII letters.
So an address with non-ASCII capitals may be planned `pending` and is then suppressed at its
claim: either way it is never sent.

This module is the typed records and the reading of an import file; the SQL is in
store/suppressions.py, the commands in commands/suppress.py."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from notifier.domain.cells import cell_value
from notifier.domain.errors import BadInput
from notifier.domain.intent import normalise_target

# Longest address SMTP carries (RFC 5321 4.5.3.1.3: a 256-octet path minus its brackets).
MAX_ADDRESS_CHARS = 254
MAX_REASON_CHARS = 1000


class Source(StrEnum):
    """Where a suppression came from."""

    OPERATOR = "operator"  # `suppress add`
    IMPORT = "import"  # `suppress import FILE.csv`
    RELAY = "relay"  # a permanent rejection of the recipient (SMTP 550/551/553 5.1.x)


@dataclass(frozen=True)
class Suppression:
    """One suppressed address as stored."""

    address: str
    reason: str | None
    source: Source
    operator: str
    created_at: str


@dataclass(frozen=True)
class Entry:
    """An address to suppress, with its reason (from the command line or an import row)."""

    address: str  # its key (address_key)
    reason: str | None


def address_key(target: str) -> str:
    """The form an address is suppressed and looked up under (see the module's docstring)."""
    return normalise_target(target).lower()


def sql_keys_alike(target: str) -> bool:
    """Whether SQL's form of the key (store/suppressions.py: trimmed of spaces, ASCII
    letters lower-cased) is `address_key(target)`: for an ASCII target whose only
    surrounding whitespace is spaces. Otherwise the key is computed here, in Python."""
    return target.isascii() and target.strip() == target.strip(" ")


def address_problem(text: str) -> str | None:
    """Why `text` cannot be suppressed as an e-mail address, or None."""
    value = normalise_target(text)
    local, at, domain = value.rpartition("@")
    if not value:
        return "is empty"
    if not at or not local or not domain or "://" in value:
        return "is not an e-mail address (local@domain)"
    if any(c.isspace() for c in value) or any(ord(c) < 32 for c in value):
        return "holds a space or a control character"
    if len(value) > MAX_ADDRESS_CHARS:
        return f"is longer than {MAX_ADDRESS_CHARS} characters"
    return None


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
    `email` (else the first column, the first line then being data when it looks like an
    address), with an optional `reason` column. BadInput naming every bad line: a file is
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
            "UTF-8 CSV file and run `notifier suppress import` again; nothing was stored."
        ) from None
    # `suppress list --format csv` escapes formula-like cells; reading them back undoes it.
    rows = [[cell_value(c) for c in row] for row in csv.reader(io.StringIO(text))]
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise BadInput(
            f"suppress import: {path} is empty. It needs a column `address` (or `email`) "
            "with one address per line; nothing was stored."
        )
    header = [cell.strip().lower() for cell in rows[0]]
    column = next((header.index(n) for n in _ADDRESS_COLUMNS if n in header), None)
    reason_column = header.index("reason") if "reason" in header else None
    first_data = 1
    if column is None:
        column = 0
        # No named column: the first line is data when it is an address itself.
        first_data = 0 if address_problem(rows[0][0] if rows[0] else "") is None else 1
    found: list[Entry] = []
    problems: list[str] = []
    for line, row in enumerate(rows[first_data:], start=first_data + 1):
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
        if len(reason) > MAX_REASON_CHARS:
            problems.append(f"line {line}: the reason is longer than {MAX_REASON_CHARS} characters")
            continue
        found.append(Entry(address_key(address), reason or None))
    if problems:
        shown = "; ".join(problems[:20])
        more = f"; and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise BadInput(
            f"suppress import: {path} has {len(problems)} bad line(s): {shown}{more}. Fix "
            "them (each line one address, local@domain) and run `notifier suppress import` "
            "again; nothing was stored."
        )
    if not found:
        raise BadInput(
            f"suppress import: {path} holds no address. It needs a column `address` (or "
            "`email`) with one address per line; nothing was stored."
        )
    return list({e.address: e for e in found}.values())
