"""A file sent without an `id` column (each row identified by its channel, recipient and
content) and sent again with one names its rows otherwise: notifier cannot tell whether a
row with an id is the notification an id-less row of the same content was, so it refuses the
file (exit 2, nothing stored, nothing sent) rather than send every row a second time, or
guess which of two rows with ids one delivery was. Sent as it was (without the ids), the
delivered rows are left out; with --resend-changed, every such row goes out again as a new
notification. Rows of that content never delivered (failed) are no such question, and two
rows that both have ids stay two notifications, as within a file. On both stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def _without_ids(rows: list[list[str]]) -> list[list[str]]:
    return [row[1:] for row in rows]  # to, subject, body, name


def test_a_file_sent_again_with_an_id_column_added_is_refused_never_sent_twice(
    ws: Workspace,
) -> None:
    """Three rows delivered without ids; the same rows with ids, and a fourth: refused,
    nothing sent. As advised, the file as it was (no ids) sends the fourth alone; with
    --resend-changed (asked for) the three would go again: the refusal's message names both."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        rows = make_rows(4)
        ws.write_csv("b.csv", _without_ids(rows[:4]))  # the header and three rows
        assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 0
        ws.write_csv("b.csv", rows)  # the same rows with an id column, and u4
        refused = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert refused.exit_code == 2, refused.output
        assert "3 row(s) have an id" in refused.output, refused.output
        assert "--resend-changed" in refused.output and "without the `id` column" in (
            refused.output
        )
        assert len(receiver.arrivals) == 3 and len(ws.ledger.runs()) == 1
        ws.write_csv("b.csv", _without_ids(rows))  # as advised: the file as it was
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 0, again.output
        deliveries = receiver.deliveries()
    assert "3 row(s) already delivered" in again.output, again.output
    assert sorted(deliveries.values()) == [1, 1, 1, 1], deliveries


def test_two_rows_with_ids_after_one_id_less_delivery_of_their_content_are_refused(
    ws: Workspace,
) -> None:
    """One delivery without an id; a file whose rows a1 and a2 both have that content:
    which one was sent is not the tool's to guess. Refused; with --resend-changed both go."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        [header, row] = make_rows(1)
        ws.write_csv("b.csv", _without_ids([header, row]))
        assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 0
        ws.write_csv("b.csv", [header, ["a1", *row[1:]], ["a2", *row[1:]]])
        refused = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert refused.exit_code == 2, refused.output
        assert len(receiver.arrivals) == 1
        forced = ws.invoke("send", "b.csv", "--channel", "hooks", "--resend-changed")
        assert forced.exit_code == 0, forced.output
    assert "2 row(s) with the content of rows" in forced.output, forced.output
    assert len(receiver.arrivals) == 3


def test_a_row_of_that_content_never_delivered_is_no_question(ws: Workspace) -> None:
    """The id-less row failed (refused 400, never delivered): the file with ids plans and
    sends it."""
    failing = {True}
    receiver = Receiver(answer=lambda item_id, n: 400 if failing else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        [header, row] = make_rows(1)
        ws.write_csv("b.csv", _without_ids([header, row]))
        assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 3
        failing.clear()
        ws.write_csv("b.csv", [header, row])
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        deliveries = receiver.deliveries()
    assert again.exit_code == 0, again.output
    assert list(deliveries.values()) == [1]


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
