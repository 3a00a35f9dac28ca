"""The Anthropic client reads the CA bundle only where TLS may be needed: over https (the
real API), never over the plain http of a local fake."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(30)


def claude_client(key: str, **options: Any) -> Any:
    """content/claude_client.py's, imported when a test calls it: importing the SDK costs
    about 1.4 s of CPU, which every test process would otherwise pay at collection."""
    from notifier.content.claude_client import claude_client as make  # noqa: PLC0415

    return make(key, **options)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every load of trusted certificates into a TLS context from here on: whichever way the
    HTTP client builds its context (ssl.create_default_context when SSL_CERT_FILE or
    SSL_CERT_DIR is set, else a bare context given a CA file), it loads them by one of these."""
    loads: list[str] = []

    def counted(name: str) -> Callable[..., None]:
        real = getattr(ssl.SSLContext, name)

        def load(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
            loads.append(name)
            real(self, *args, **kwargs)

        return load

    for name in ("load_verify_locations", "load_default_certs"):
        monkeypatch.setattr(ssl.SSLContext, name, counted(name))
    return loads


def test_over_plain_http_to_this_machine_no_certificates_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads = _counting(monkeypatch)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    client = claude_client("k", max_retries=0, timeout=5.0)
    client.close()
    assert loads == []
    assert str(client.base_url).startswith("http://127.0.0.1:9")


@pytest.mark.parametrize(
    "base_url", [None, "https://api.example.test", "http://gateway.example.test"]
)
@pytest.mark.parametrize("cert_env", [True, False])
def test_elsewhere_the_trusted_certificates_are_read(
    monkeypatch: pytest.MonkeyPatch, base_url: str | None, cert_env: bool
) -> None:
    """The real API, or an http gateway that may redirect to https: the bundle is read,
    with or without SSL_CERT_FILE naming it."""
    if not cert_env:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    loads = _counting(monkeypatch)
    if base_url is None:
        monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
    claude_client("k", max_retries=0).close()
    assert loads, "a client that may need TLS was built without the trusted certificates"
