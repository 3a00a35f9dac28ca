"""Secrets out of what a downstream says: a server that echoes what it was sent (a relay
quoting the AUTH line, a webhook receiver quoting the secret it expected, an API quoting the
key it refused) must not carry a secret into a stored error, a report or a message."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

MASK = "***"


def redacted(text: str, secrets: Iterable[str | None]) -> str:
    """`text` with every secret in it replaced by MASK, in each spelling a server may echo it
    in: `masked` by `masks(secrets)`."""
    return masked(text, masks(secrets))


def masks(secrets: Iterable[str | None]) -> tuple[str, ...]:
    """What to mask for `secrets`: each in every spelling (`spellings`), longest first (a
    secret and a part of it, as a Standard Webhooks secret and its key without `whsec_`).
    Worked out once by a channel that masks every answer (a webhook's receipt ids)."""
    every = {spelling for secret in secrets if secret for spelling in spellings(secret)}
    return tuple(sorted(every, key=len, reverse=True))


def masked(text: str, masks: tuple[str, ...]) -> str:
    """`text` with each of `masks` replaced by MASK, in order."""
    for mask in masks:
        text = text.replace(mask, MASK)
    return text


def literal(text: str) -> str:
    """`text` with each control character (an escape sequence would act on the terminal of
    whoever reads the report it is quoted in; a line break would end its line) and each
    line or paragraph separator shown as U+FFFD, as is each lone surrogate (JSON can spell
    one; no store or terminal can encode it): what a downstream (or an old record) says,
    kept and shown as it reads, never acted on."""
    if text.isprintable():
        # No character of category Other or Separator (but the ASCII space): none of
        # _NOT_SHOWN. Most answers are: a receipt id, a digest, an error line.
        return text
    return "".join("\ufffd" if unicodedata.category(ch) in _NOT_SHOWN else ch for ch in text)


_NOT_SHOWN = ("Cc", "Zl", "Zp", "Cs")


def spellings(secret: str) -> set[str]:
    """`secret` as written, and as an echo may spell it: inside a JSON string (with `/` escaped
    too, as PHP's json_encode and others do by default: a base64 key's `/` become `\\/`),
    and percent-encoded in a URL or a form (`/` kept or not, upper- or lower-case hex, as
    Python's quote and .NET's UrlEncode write it). Each is as readable as the secret."""
    in_json = json.dumps(secret, ensure_ascii=False)[1:-1]
    encoded = {quote(secret, safe=""), quote(secret), quote_plus(secret)}
    lower_hex = {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), e) for e in encoded}
    return {secret, in_json, in_json.replace("/", "\\/"), *encoded, *lower_hex}
