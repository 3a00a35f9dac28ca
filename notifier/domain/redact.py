"""Secrets out of what a downstream says: a server that echoes what it was sent (a relay
quoting the AUTH line, a webhook receiver quoting the secret it expected, an API quoting the
key it refused) must not carry a secret into a stored error, a report or a message."""

from __future__ import annotations

from collections.abc import Iterable

MASK = "***"


def redacted(text: str, secrets: Iterable[str | None]) -> str:
    """`text` with every secret in it replaced by MASK, longest first (a secret and a part
    of it, as a Standard Webhooks secret and its key without `whsec_`)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
