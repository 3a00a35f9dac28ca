"""The one way notifier makes the Anthropic SDK's client, for drafting and for cancelling
drafts: tenacity owns the retries where it drafts, and the base URL comes from
ANTHROPIC_BASE_URL when set (the tests point it at a fake on 127.0.0.1)."""

from __future__ import annotations

import os
import ssl

import anthropic


def claude_client(
    key: str, *, max_retries: int, timeout: float | None = None
) -> anthropic.Anthropic:
    """The SDK's client. Over plain http its HTTP client gets a TLS context that trusts no
    certificate, instead of one holding the CA bundle the SDK would read for it (30 ms of CPU
    per client): nothing there needs TLS, and a redirect to https would fail closed. Without
    `timeout`, the SDK's own."""
    base_url = os.environ.get("ANTHROPIC_BASE_URL", "")
    http_client = None
    if base_url.lower().startswith("http://"):
        trusts_nothing = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        http_client = anthropic.DefaultHttpxClient(verify=trusts_nothing)
    if timeout is None:
        return anthropic.Anthropic(api_key=key, max_retries=max_retries, http_client=http_client)
    return anthropic.Anthropic(
        api_key=key, max_retries=max_retries, timeout=timeout, http_client=http_client
    )
