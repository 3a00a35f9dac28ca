"""A relay's reply is quoted in one line (its runs of white space made one space), its
secrets masked: masked before the spaces are folded, so a password holding two spaces in a
row, or a line break, echoed by a relay is never quoted, even in part."""

from __future__ import annotations

import pytest

from notifier.channels.smtp_pool import Relay

PASSWORDS = ["two  spaces in it", "a tab\there", "line\r\nbreak"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_echoed_in_a_reply_is_masked_whatever_its_white_space(password: str) -> None:
    relay = Relay("mail", "relay.example", 25, False, False, 5.0, password=password,
                  secrets=(password,))  # fmt: skip
    quoted = relay.reply_text(f"535 5.7.8 bad credentials {password} for ops".encode())
    words = [word for word in password.split() if len(word) > 3]
    assert not any(word in quoted for word in words), quoted
    assert quoted.startswith("535 5.7.8 bad credentials"), quoted
