"""A file without an `id` column whose row is repeated is refused by a plain `send` (both
copies would reach the same recipient); the same file sent with `--compose` must not send
both copies either: each copy is drafted and frozen as its own item, under its own key, and
the recipient gets the same row's notification twice."""

from __future__ import annotations

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_repeated_row_in_a_composed_file_is_refused_as_a_plain_send_refuses_it(
    ws: Workspace, fake: FakeMessages
) -> None:
    brief = ws.path / "brief.txt"
    brief.write_text("Tell each customer their plan renews next week.", "utf-8")
    ws.write_csv(
        "d.csv",
        [["to", "name"], ["user1@example.com", "User 1"], ["user1@example.com", "User 1"]],
    )
    plain = ws.invoke("send", "d.csv", "--dry-run")
    assert plain.exit_code == 2, plain.output  # the plain path refuses the repeated line
    composed = ws.invoke("send", "d.csv", "--compose", str(brief))
    assert composed.exit_code == 2, composed.output
    assert ws.outbox_documents() == [], "nothing sent for a refused file"
    assert fake.rows_requested() == [], "nothing drafted for a refused file"
