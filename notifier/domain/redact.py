"""Secrets out of what a downstream says: a server that echoes what it was sent (a relay
quoting the AUTH line, a webhook receiver quoting the secret it expected, an API quoting the
key it refused) must not carry a secret into a stored error, a report or a message."""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

MASK = "***"


def redacted(text: str, secrets: Iterable[str | None]) -> str:
    """`text` with every secret in it replaced by MASK, longest first (a secret and a part
    of it, as a Standard Webhooks secret and its key without `whsec_`), in each spelling a
    server may echo it in (`spellings`)."""
    every = {spelling for secret in secrets if secret for spelling in spellings(secret)}
    for spelling in sorted(every, key=len, reverse=True):
        text = text.replace(spelling, MASK)
    return text


def spellings(secret: str) -> set[str]:
    """`secret` as written, and as an echo may spell it: inside a JSON string (with `/` escaped
    too, as PHP's json_encode and others do by default: a base64 key's `/` become `\\/`),
    and percent-encoded in a URL or a form. Each is as readable as the secret itself."""
    in_json = json.dumps(secret, ensure_ascii=False)[1:-1]
    return {secret, in_json, in_json.replace("/", "\\/"), quote(secret, safe=""),
            quote_plus(secret)}  # fmt: skip
