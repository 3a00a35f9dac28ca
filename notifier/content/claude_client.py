"""The one way notifier makes the Anthropic SDK's client, for drafting and for cancelling
drafts: tenacity owns the retries where it drafts, and the base URL comes from
ANTHROPIC_BASE_URL when set (the tests point it at a fake on 127.0.0.1)."""

from __future__ import annotations

import os
import ssl
from urllib.parse import urlsplit

import anthropic

# Where a plain-http base URL can only be a local stand-in for the API.
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def claude_client(
    key: str, *, max_retries: int, timeout: float | anthropic.NotGiven = anthropic.NOT_GIVEN
) -> anthropic.Anthropic:
    """The SDK's client (its own timeout unless `timeout` is given). Over plain http to this
    machine its HTTP client gets a TLS context that trusts no certificate, instead of one
    holding the CA bundle the SDK would read for it (30 ms of CPU per client): nothing there
    needs TLS, and a redirect to https would fail closed."""
    base_url = os.environ.get("ANTHROPIC_BASE_URL", "")
    http_client = None
    parts = urlsplit(base_url)
    if parts.scheme.lower() == "http" and parts.hostname in _LOOPBACK:
        trusts_nothing = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        http_client = anthropic.DefaultHttpxClient(verify=trusts_nothing)
    return anthropic.Anthropic(
        api_key=key, max_retries=max_retries, timeout=timeout, http_client=http_client
    )
