"""A row's `id` is its identity across runs and what an operator types after `--item`: one
holding a control character (a NUL from a binary export, an escape sequence, a line break
inside quotes) cannot be typed, acts on the terminal of whoever lists it, and PostgreSQL
cannot store a NUL at all. The file is refused as `to` is (exit 2, the line and the
character named), on either store, never an internal error with the plan half-made."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_stores]


@pytest.mark.parametrize("control", ["\x00", "\x1b", "\n", "\u2028"])
def test_an_id_with_a_control_character_fails_the_file_naming_its_line(
    ws: Workspace, control: str
) -> None:
    ws.write_csv(
        "b.csv",
        [
            ["id", "to", "subject"],
            ["a1", "ann@example.com", "Hi"],
            [f"b{control}2", "bob@x.org", "Hi"],
        ],
    )
    result = ws.invoke("send", "b.csv")
    assert result.exit_code == 2, result.output
    assert "line 3" in result.output and "`id`" in result.output, result.output
    assert f"U+{ord(control):04X}" in result.output, result.output
    assert "internal error" not in result.output
    assert ws.outbox_documents() == []
    assert not ws.has_database() or ws.ledger.runs() == []
