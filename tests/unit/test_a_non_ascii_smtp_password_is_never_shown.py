"""An SMTP password (password_env) is never shown, not even in part: smtplib encodes the
AUTH PLAIN/LOGIN answer as ASCII, so a password with a non-ASCII character raises a
UnicodeEncodeError whose text names that character and its position in `\\0user\\0password`."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from notifier.domain.answers import ChannelError

from .test_smtp_channel import Server, _authenticating, make_intent, start_server  # noqa: F401

pytestmark = [
    pytest.mark.timeout(60),
    # The test relay takes AUTH in the clear (aiosmtpd warns): what is checked is our side.
    pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS"),
]
SECRET = "SeKrEtÿ123"


def test_a_non_ascii_password_is_named_by_its_variable_never_shown(
    start_server: Callable[..., Server],  # noqa: F811 (the fixture, imported)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _server, channel = _authenticating(start_server, monkeypatch, SECRET)
    try:
        with pytest.raises(Exception) as info:
            channel.send(make_intent())
    finally:
        channel.close()
    text = f"{type(info.value).__name__}: {info.value}"
    assert isinstance(info.value, ChannelError), text
    assert "TEST_SMTP_PASSWORD" in text
    for shown in ("ÿ", "\\xff", "position"):
        assert shown not in text, text
