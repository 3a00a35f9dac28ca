"""A channel's name is stored with every item of a run, listed by `runs` and `status` and
typed after `--channel`: a name holding a control character (`[channels."a\\u0000b"]`, an
escape sequence, a line break) cannot be typed, shows one way in one listing and another in
the next, and PostgreSQL cannot store a NUL at all (the plan failed as an internal error).
An empty name is one no row can choose (an empty `channel` cell means the default). Each is
refused when notifier.toml loads: exit 2 naming the section, nothing stored or sent."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_stores]


@pytest.mark.parametrize(
    ("written", "said"),
    [("a\\u0000b", "U+0000"), ("a\\u001b[31mb", "U+001B"), ("a\\nb", "U+000A"), ("", "empty")],
)
def test_a_channel_named_with_a_control_character_or_nothing_exits_2(
    ws: Workspace, written: str, said: str
) -> None:
    (ws.path / "notifier.toml").write_text(f'[channels."{written}"]\ntype = "outbox"\n')
    name = written.replace("\\u0000", "\x00").replace("\\u001b", "\x1b").replace("\\n", "\n")
    ws.write_csv("b.csv", [["to", "channel"], ["ann@example.com", name]])
    result = ws.invoke("send", "b.csv")
    assert result.exit_code == 2, result.output
    assert "notifier.toml" in result.output and said in result.output, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert ws.outbox_documents() == []
    assert not ws.has_database() or ws.ledger.runs() == []
