"""`[retry]` counts and durations are TOML numbers, and `max_attempts` and `down_after` are
whole ones. A quoted number (`max_attempts = "2.5"`) was read as far as one conversion went:
`"3"` was taken as 3, `"2.5"` passed the range check then failed the next conversion as an
internal error (exit 1, "`notifier status` shows where the run stands" with no run at all);
`2.5` became 2 and `true` became 1 without a word. Each is bad input like a channel's
`timeout = "10"`: exit 2 naming the setting and what it must be, nothing stored.

TOML integers have no bound in the reader, and one past a float's range (400 digits) made
every range check of a number setting (`[retry]`, `[lease] ttl`, a channel's `timeout`,
`rate`, `domain_rates`) an OverflowError: an internal error where its range is what to say."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(30)]


@pytest.mark.parametrize(
    ("line", "key", "must"),
    [
        ('max_attempts = "2.5"', "max_attempts", "whole number"),
        ('down_after = "1e1"', "down_after", "whole number"),
        ('max_attempts = "3"', "max_attempts", "whole number"),
        ("max_attempts = 2.5", "max_attempts", "whole number"),
        ("down_after = true", "down_after", "whole number"),
        ('deadline = "900"', "deadline", "number"),
        ("backoff_base = false", "backoff_base", "number"),
    ],
)
def test_a_retry_value_of_the_wrong_type_exits_2_naming_the_setting(
    ws: Workspace, line: str, key: str, must: str
) -> None:
    (ws.path / "notifier.toml").write_text(f"[retry]\n{line}\n")
    ws.write_csv("b.csv", [["to", "subject"], ["ann@example.com", "Hi"]])
    result = ws.invoke("send", "b.csv")
    assert result.exit_code == 2, result.output
    assert f"[retry] {key}" in result.output and must in result.output, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert ws.outbox_documents() == []
    assert not ws.db_file.exists()


HUGE = "9" * 400
WEBHOOK = '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/n"\n'
SMTP = '[channels.hooks]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 25\nsender = "a@b.org"\n'


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (f"[retry]\nmax_attempts = {HUGE}\n", "max_attempts"),
        (f"[retry]\ndeadline = {HUGE}\n", "deadline"),
        (f"[lease]\nttl = {HUGE}\n", "ttl"),
        (f"{WEBHOOK}timeout = {HUGE}\n", "timeout"),
        (f"{WEBHOOK}rate = {HUGE}\n", "rate"),
        (f'{SMTP}domain_rates = {{ "example.com" = {HUGE} }}\n', "domain_rates"),
    ],
)
def test_an_integer_past_a_floats_range_exits_2_naming_the_setting(
    ws: Workspace, config: str, key: str
) -> None:
    (ws.path / "notifier.toml").write_text(config)
    ws.write_csv("b.csv", [["to", "subject"], ["ann@example.com", "Hi"]])
    channel = ["--channel", "hooks"] if "[channels" in config else []
    result = ws.invoke("send", "b.csv", *channel)
    assert result.exit_code == 2, result.output
    assert key in result.output and "internal error" not in result.output, result.output
    assert ws.outbox_documents() == []
    assert not ws.db_file.exists()


@pytest.mark.parametrize(
    "line", ["max_attempts = 3", "max_attempts = 3.0", "deadline = 900", "backoff_base = 0.5"]
)
def test_a_retry_value_written_as_a_number_is_taken(ws: Workspace, line: str) -> None:
    (ws.path / "notifier.toml").write_text(f"[retry]\n{line}\n")
    ws.write_csv("b.csv", [["to", "subject"], ["ann@example.com", "Hi"]])
    assert ws.invoke("send", "b.csv").exit_code == 0
