"""The suppression list: addresses that are never sent to, whatever a batch says.

An address is kept under its key: the intent's normalisation of a target (NFC, trimmed,
domain lower-cased: intent.normalise_target) with the local part lower-cased too, so that
`Ann@Example.com` and `ann@example.com` are one address. The intent keeps the local part's
case (RFC 5321 lets a mailbox tell them apart, and the digest must not change); a
suppression errs the other way, because mailing an address its owner asked to stop is the
mistake that costs, and no real mailbox is told apart by case alone.

An internationalised domain has two spellings that reach one mailbox: `bücher.example` goes
on the wire as `xn--bcher-kva.example`. An entry keeps the spelling it was given, and a row
is matched under both of its domain's (`address_keys`).

Where a row is matched: at plan time by SQL (store/suppressions.py, one pass over the new
items, with the database lower-casing ASCII letters only, the same on both engines), and
again at the claim by this module's `address_key`, which also lower-cases non-ASCII letters.
So an address with non-ASCII capitals, or written in the other spelling of its domain, may
be planned `pending` and is then suppressed at its claim: either way it is never sent.

This module is the typed records and the address rules; the SQL is in
store/suppressions.py, the commands and the reading of an import file in cli/suppress.py."""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass
from enum import StrEnum

from notifier.domain.intent import invisible_character, normalise_target

# Longest address SMTP carries (RFC 5321 4.5.3.1.3: a 256-octet path minus its brackets).
MAX_ADDRESS_CHARS = 254
MAX_REASON_CHARS = 1000


def reason_problem(reason: str) -> str | None:
    """Why `reason` cannot be kept with an entry, or None: too long, or holding a control
    character (an escape sequence would act on the terminal of whoever lists it)."""
    if len(reason) > MAX_REASON_CHARS:
        return f"is longer than {MAX_REASON_CHARS} characters"
    if any(unicodedata.category(ch) == "Cc" for ch in reason):
        return (
            "holds a control character (an escape sequence or a line break, which would act "
            "on the terminal of whoever lists it)"
        )
    return None


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


def address_keys(target: str) -> tuple[str, ...]:
    """Every key `target` is suppressed under: its own, and where its domain is
    internationalised, the keys under its other spellings, label by label as IDNA 2008
    writes them (punycode, as the wire carries it, or the Unicode it decodes to). An entry
    is kept under the spelling it was given, which may mix the two (`bücher.xn--caf-dma.fr`):
    every mix is a key, up to MIXED_LABELS internationalised labels (past that, 2 to their
    number would be, and only the two whole spellings are)."""
    key = address_key(target)
    local, at, domain = key.rpartition("@")
    if not at:
        return (key,)
    spellings = [_label_spellings(label) for label in domain.split(".")]
    if sum(len(s) > 1 for s in spellings) > MIXED_LABELS:
        whole = [tuple(s[i] if len(s) > 1 else s[0] for s in spellings) for i in (0, 1)]
        domains = [".".join(labels) for labels in whole]
    else:
        domains = [".".join(labels) for labels in itertools.product(*spellings)]
    return tuple(dict.fromkeys([key, *(f"{local}@{d}" for d in domains)]))


# How many internationalised labels a domain may have for every mix of their spellings to
# be a key: 2**4 = 16 keys at most.
MIXED_LABELS = 4


def _label_spellings(label: str) -> tuple[str, ...]:
    """A domain label as written, and in its other spelling if it has one (lower case)."""
    try:
        if not label.isascii():
            return (label, "xn--" + label.encode("punycode").decode("ascii"))
        if label.startswith("xn--"):
            return (label, label[4:].encode("ascii").decode("punycode").lower())
    except UnicodeError:
        pass
    return (label,)


def registered_spelling(domain: str) -> str:
    """A domain as IDNA 2008 registers it, label by label with no mapping (`ß` stays `ß`, so
    `straße` is `xn--strae-oqa`): each Unicode label as its punycode (lower case)."""
    return ".".join(_label_spellings(label)[-1] if not label.isascii() else label
                    for label in domain.lower().split("."))  # fmt: skip


def domain_key(domain: str) -> str:
    """A domain as its `domain_rates` bucket knows it: trimmed, lower case, no trailing dot,
    an internationalised label in the one spelling IDNA 2008 registers (punycode, as the
    wire carries it), so that `bücher.example` and `xn--bcher-kva.example` are one domain
    with one rate."""
    text = domain.strip().rstrip(".").lower()
    try:
        return registered_spelling(text)
    except UnicodeError:
        return text


# A host name as domain_key spells it: dot-separated labels of letters, digits, `-` and `_`.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def domain_problem(domain: str) -> str | None:
    """Why `domain` (a `domain_rates` key) can never be a recipient's domain, or None: a
    wildcard, a port, a scheme, a path or a space is never part of one."""
    key = domain_key(domain)
    if not _HOST_NAME.fullmatch(key):
        return "is not a domain name like gmail.com (no wildcard, port, scheme or path)"
    return None


def misdotted(domain: str) -> bool:
    """Whether `domain` has a dot at an end or two in a row: no mailbox's domain has."""
    return domain.startswith(".") or domain.endswith(".") or ".." in domain


def sql_keys_alike(target: str) -> bool:
    """Whether SQL's form of the key (store/suppressions.py: trimmed of spaces, ASCII
    letters lower-cased) is `address_keys(target)`: for an ASCII target whose only
    surrounding whitespace is spaces and whose domain is not punycode. Otherwise the keys
    are computed here, in Python."""
    return target.isascii() and target.strip() == target.strip(" ") and "xn--" not in target.lower()


# What no recipient's address holds, as a row's `to` spells it (an smtp channel refuses each:
# channels/smtp_options.py): brackets, quotes, a `mailto:`, list separators.
_NOT_IN_AN_ADDRESS = re.compile(r'[<>"(),;:\[\]\\]')


def address_problem(text: str) -> str | None:
    """Why `text` cannot be suppressed as an e-mail address, or None.

    An entry is refused, never stored, when no row's recipient could be keyed like it: it
    would be listed, and its owner mailed all the same. So an invisible character (a
    byte-order mark left mid-file where two exports were joined, a zero-width space pasted
    with the address), brackets, quotes, a `mailto:` and a dot at either end of the domain
    are refused, each named, for the operator to give the bare address."""
    value = normalise_target(text)
    local, at, domain = value.rpartition("@")
    if not value:
        return "is empty"
    if not at or not local or not domain or "://" in value:
        return "is not an e-mail address (local@domain)"
    if any(c.isspace() for c in value) or any(ord(c) < 32 for c in value):
        return "holds a space or a control character"
    hidden = invisible_character(value)
    if hidden is not None:
        return f"holds the invisible character U+{ord(hidden):04X}"
    decoration = _NOT_IN_AN_ADDRESS.search(value)
    if decoration is not None:
        return (
            f"holds {decoration.group()!r}: brackets, quotes, a mailto: and separators are "
            "no part of the address"
        )
    if misdotted(domain):
        return "has a dot at an end of its domain, or two in a row"
    if len(value) > MAX_ADDRESS_CHARS:
        return f"is longer than {MAX_ADDRESS_CHARS} characters"
    return None
