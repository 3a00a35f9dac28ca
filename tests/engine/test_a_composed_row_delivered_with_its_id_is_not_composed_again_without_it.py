"""A file composed and delivered with an `id` column, then composed again with that column
dropped, names its rows otherwise: the row's earlier item is found by neither key (its
identity is `id:u1`, its intent digest that of the drafted text), so the refusal that holds
a plain file with its id column dropped must hold a composed one too: exit 2, nothing
drafted, nothing sent a second time. On both stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_composed_file_sent_again_with_its_id_column_dropped_is_refused(
    ws: Workspace, fake: FakeMessages
) -> None:
    brief = ws.path / "brief.txt"
    brief.write_text("Tell each customer their plan renews next week.", "utf-8")
    ws.write_csv("d.csv", [["id", "to", "name"], ["u1", "user1@example.com", "User 1"]])
    first = ws.invoke("send", "d.csv", "--compose", str(brief))
    assert first.exit_code == 0, first.output
    ws.write_csv("d.csv", [["to", "name"], ["user1@example.com", "User 1"]])
    again = ws.invoke("send", "d.csv", "--compose", str(brief))
    sent = ws.query("SELECT COUNT(*) FROM items WHERE state = 'sent'")
    assert again.exit_code == 2, again.output
    assert sent == [(1,)], sent
