"""The Anthropic client reads the CA bundle only where TLS may be needed: over https (the
real API), never over the plain http of a local fake."""

from __future__ import annotations

import ssl

import pytest

from notifier.content.claude_client import claude_client

pytestmark = pytest.mark.timeout(30)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built: list[int] = []
    real = ssl.create_default_context

    def counted(*args: object, **kwargs: object) -> ssl.SSLContext:
        built.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    return built


def test_over_plain_http_no_certificates_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _counting(monkeypatch)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    client = claude_client("k", max_retries=0, timeout=5.0)
    client.close()
    assert built == []
    assert str(client.base_url).startswith("http://127.0.0.1:9")


@pytest.mark.parametrize("base_url", [None, "https://api.example.test"])
def test_over_https_the_trusted_certificates_are_read(
    monkeypatch: pytest.MonkeyPatch, base_url: str | None
) -> None:
    built = _counting(monkeypatch)
    if base_url is None:
        monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
    claude_client("k", max_retries=0).close()
    assert built, "an https client was built without the trusted certificates"
