"""Numbers notifier reads from text it does not write (an environment variable, a stray
directory's name in the temp directory) are ASCII digits: a superscript two or an
Arabic-Indic digit is a digit to `str.isdigit` but no number to `int`, and must be refused
as any other bad value, never raise from deep inside (an internal error)."""

from __future__ import annotations

import pytest

from notifier.content import drafting
from notifier.engine.crash import CrashSpecError, from_env

OTHER_DIGITS = ["\u00b2", "\u0661\u0662"]  # superscript two; Arabic-Indic one, two


@pytest.mark.parametrize("seq", OTHER_DIGITS)
def test_a_crash_point_numbered_in_other_digits_is_a_bad_spec(seq: str) -> None:
    with pytest.raises(CrashSpecError, match="is not POINT:SEQ"):
        from_env({"NOTIFIER_CRASH_AT": f"after-send:{seq}"})


@pytest.mark.parametrize("rows", OTHER_DIGITS)
def test_a_chunk_size_in_other_digits_falls_back_to_the_default(
    rows: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifier.content.claude_batches import CHUNK_ROWS  # noqa: PLC0415 (the SDK: only here)

    monkeypatch.setenv(drafting.CHUNK_ENV, rows)
    assert drafting.chunk_rows() == CHUNK_ROWS
