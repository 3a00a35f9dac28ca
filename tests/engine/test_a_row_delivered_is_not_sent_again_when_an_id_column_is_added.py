"""A row delivered from a file without an `id` column (its identity: channel, recipient and
content) is the same notification when the file is sent again with an id column added (a
re-export, every recipient, subject and body unchanged): left out as delivered, never sent
a second time. Two rows that both have ids stay two notifications whatever their content, as
within a file. On both stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_the_same_rows_sent_again_with_an_id_column_added_are_not_delivered_twice(
    ws: Workspace,
) -> None:
    """Three rows delivered without ids; the file again with ids and a fourth row: only the
    fourth is planned and sent, the three are counted as already delivered."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        rows = make_rows(4)
        ws.write_csv("b.csv", [r[1:] for r in rows[:4]])  # header and three rows, no id
        first = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert first.exit_code == 0, first.output
        ws.write_csv("b.csv", rows)  # the same rows with an id column, and u4
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        deliveries = receiver.deliveries()
    assert again.exit_code == 0, again.output
    assert "3 row(s) already delivered" in again.output, again.output
    assert sorted(deliveries.values()) == [1, 1, 1, 1], deliveries
    assert len(receiver.arrivals) == 4
    assert len(ws.ledger.items()) == 4


def test_two_rows_with_ids_are_two_notifications_whatever_their_content(
    ws: Workspace,
) -> None:
    """A row with id a1 delivered; a file whose row a2 has the very same channel, recipient
    and content is another notification, sent."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        [header, row] = make_rows(1)
        ws.write_csv("b.csv", [header, ["a1", *row[1:]]])
        assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 0
        ws.write_csv("b.csv", [header, ["a2", *row[1:]]])
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert again.exit_code == 0, again.output
    assert sorted(a.item_id for a in receiver.arrivals) == ["a1", "a2"]
