"""redact.literal: what a downstream says is kept as it reads, with each control character,
line or paragraph separator and lone surrogate shown as U+FFFD, and nothing else changed
(the common answer, all printable, is returned as it came, without a look at each
character)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifier.domain.redact import literal


def _by_each_character(text: str) -> str:
    return "".join(
        "\ufffd" if unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs") else ch for ch in text
    )


@pytest.mark.timeout(60)
@given(st.text(alphabet=st.characters(exclude_categories=())))  # lone surrogates too
def test_every_character_is_shown_by_its_category_alone(text: str) -> None:
    assert literal(text) == _by_each_character(text)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("said", "shown"),
    [
        ("rcpt_01 ok", "rcpt_01 ok"),
        ("\x1b[2Jgone", "\ufffd[2Jgone"),
        ("a\u2028b\u2029c\x85d", "a\ufffdb\ufffdc\ufffdd"),
        ("lone \ud800 half", "lone \ufffd half"),
        ("no\u00a0break and \u200b zero-width", "no\u00a0break and \u200b zero-width"),
        ("", ""),
    ],
)
def test_a_downstreams_words_keep_all_but_what_acts_on_a_terminal(said: str, shown: str) -> None:
    assert literal(said) == shown
