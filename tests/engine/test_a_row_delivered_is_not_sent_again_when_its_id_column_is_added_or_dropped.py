"""A file sent without an `id` column (each row identified by its channel, recipient and
content) and sent again with one, or the other way round, names its rows otherwise: notifier
cannot tell whether a row is the notification a row of the same content named otherwise
was, so it refuses the file (exit 2, nothing stored, nothing sent) rather than send every row
a second time, or guess which of two rows with ids one delivery was. Sent as it was (with
the ids it had, or without), the delivered rows are left out; with --resend-changed, every
such row goes out again as a new notification. Rows of that content never delivered
(failed) are no such question, and two rows that both have ids stay two notifications, as
within a file. On both stores."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import Result

from ..conftest import Workspace, make_rows
from ..fake_messages import FakeMessages
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]
# A file's rows as it names them: with their id column, or without it.
Named = Callable[[list[list[str]]], list[list[str]]]


def _without_ids(rows: list[list[str]]) -> list[list[str]]:
    return [row[1:] for row in rows]  # to, subject, body, name


def _hooks(ws: Workspace, receiver: Receiver) -> None:
    (ws.path / "notifier.toml").write_text(webhook_config(receiver, idempotent=False, status=False))


def _refused_then_sent_as_it_was(
    ws: Workspace, receiver: Receiver, then: Named, now: Named
) -> Result:
    """Three rows delivered from a file named `then` (with or without its ids); the same rows
    named `now`, and a fourth: refused, nothing sent, the refusal naming --resend-changed and
    the file as it was. Returns the send of the file as it was (then), four rows."""
    rows = make_rows(4)
    ws.write_csv("b.csv", then(rows[:4]))  # the header and three rows
    assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 0
    ws.write_csv("b.csv", now(rows))  # the same rows named otherwise, and u4
    refused = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert refused.exit_code == 2, refused.output
    assert "3 row(s) have the channel, recipient and content" in refused.output
    assert "--resend-changed" in refused.output and "its `id` column as it was" in (refused.output)
    assert len(receiver.arrivals) == 3 and len(ws.ledger.runs()) == 1
    ws.write_csv("b.csv", then(rows))  # as advised: the file as it was
    again = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert again.exit_code == 0, again.output
    return again


def test_a_file_sent_again_with_an_id_column_added_is_refused_never_sent_twice(
    ws: Workspace,
) -> None:
    """Three rows delivered without ids; the same rows with ids, and a fourth: refused,
    nothing sent. As advised, the file as it was (no ids) sends the fourth alone; with
    --resend-changed (asked for) the three would go again: the refusal's message names both."""
    receiver = Receiver()
    with receiving(receiver):
        _hooks(ws, receiver)
        again = _refused_then_sent_as_it_was(ws, receiver, _without_ids, lambda rows: rows)
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
        _hooks(ws, receiver)
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
        _hooks(ws, receiver)
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
        _hooks(ws, receiver)
        [header, row] = make_rows(1)
        ws.write_csv("b.csv", [header, ["a1", *row[1:]]])
        assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 0
        ws.write_csv("b.csv", [header, ["a2", *row[1:]]])
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert again.exit_code == 0, again.output
    assert sorted(a.item_id for a in receiver.arrivals) == ["a1", "a2"]


def test_the_refusal_names_every_row_resend_changed_would_send_again(ws: Workspace) -> None:
    """u1 delivered with its id, x2..x4 without ids; the file with ids for all and u1
    amended: the refusal names both kinds (one changed, three of another file's content)
    before --resend-changed would send all four again."""
    receiver = Receiver()
    with receiving(receiver):
        _hooks(ws, receiver)
        header, *rows = make_rows(4)
        ws.write_csv("a.csv", [header, rows[0]])
        assert ws.invoke("send", "a.csv", "--channel", "hooks").exit_code == 0
        ws.write_csv("b.csv", _without_ids([header, *rows[1:]]))
        assert ws.invoke("send", "b.csv", "--channel", "hooks").exit_code == 0
        amended = [*rows[0][:3], rows[0][3] + " (amended)", *rows[0][4:]]
        ws.write_csv("c.csv", [header, amended, *rows[1:]])
        refused = ws.invoke("send", "c.csv", "--channel", "hooks")
    assert refused.exit_code == 2, refused.output
    assert "1 row(s) were delivered before" in refused.output, refused.output
    assert "3 row(s) have the channel, recipient and content" in refused.output
    assert len(receiver.arrivals) == 4


def test_a_row_open_in_an_unfinished_id_less_run_is_refused_as_open_even_resent(
    ws: Workspace,
) -> None:
    """Two runs never hold one notification open, however the file names its rows: the
    id-less row awaits approval in its run; the file with ids is refused as open (resume or
    cancel that run), --resend-changed or not, and approving and resuming the first run
    delivers it once."""
    receiver = Receiver()
    with receiving(receiver):
        _hooks(ws, receiver)
        header, row = make_rows(1)
        ws.write_csv("b.csv", _without_ids([header, row]))
        first = ws.invoke("send", "b.csv", "--channel", "hooks", "--require-approval")
        assert first.exit_code == 0, first.output
        ws.write_csv("b.csv", [header, row])
        for extra in ([], ["--resend-changed"]):
            again = ws.invoke("send", "b.csv", "--channel", "hooks", *extra)
            assert again.exit_code == 2, again.output
            assert "still open" in again.output, again.output
        [run] = ws.ledger.runs()
        fingerprint = run.fingerprint
        assert fingerprint is not None
        approved = ws.invoke("approve", run.run_id, "--fingerprint", fingerprint)
        assert approved.exit_code == 0, approved.output
        assert ws.invoke("resume", run.run_id).exit_code == 0
    assert len(receiver.arrivals) == 1


def test_a_row_never_sent_by_a_cancelled_or_rejected_id_less_run_is_no_question(
    ws: Workspace,
) -> None:
    """Never delivered (its run cancelled, or rejected, before sending): the file with ids
    plans the row, not refused as maybe delivered; after a rejection it waits for approval,
    as every row a reviewer rejected does, however the file names it."""
    receiver = Receiver()
    with receiving(receiver):
        _hooks(ws, receiver)
        header, row = make_rows(1)
        ws.write_csv("b.csv", _without_ids([header, row]))
        assert ws.invoke("send", "b.csv", "--channel", "hooks", "--require-approval").exit_code == 0
        assert ws.invoke("cancel").exit_code in (0, 3)
        ws.write_csv("b.csv", [header, row])
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 0, again.output
        assert len(receiver.arrivals) == 1
        [header2, row2] = make_rows(1, start=2)
        ws.write_csv("r.csv", _without_ids([header2, row2]))
        assert ws.invoke("send", "r.csv", "--channel", "hooks", "--require-approval").exit_code == 0
        assert ws.invoke("reject", "--reason", "add an id column").exit_code == 0
        ws.write_csv("r.csv", [header2, row2])
        planned = ws.invoke("send", "r.csv", "--channel", "hooks")
    assert planned.exit_code == 0, planned.output
    assert "waits for approval" in planned.output, planned.output
    assert len(receiver.arrivals) == 1


def test_the_refusal_of_a_composed_file_names_a_way_out_that_works(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Composed and delivered without ids, then the file with an id column: refused, and the
    refusal names the way that works for a composed file (the file as it was), not
    --resend-changed, which `send --compose` does not take."""
    brief = ws.path / "brief.txt"
    brief.write_text("Tell each customer their plan renews next week.", "utf-8")
    ws.write_csv("d.csv", [["to", "name"], ["user1@example.com", "User 1"]])
    first = ws.invoke("send", "d.csv", "--compose", str(brief))
    assert first.exit_code == 0, first.output
    ws.write_csv("d.csv", [["id", "to", "name"], ["u1", "user1@example.com", "User 1"]])
    refused = ws.invoke("send", "d.csv", "--compose", str(brief))
    assert refused.exit_code == 2, refused.output
    assert "its `id` column as it was" in refused.output, refused.output
    assert "--resend-changed" not in refused.output, refused.output


def test_a_file_sent_again_with_its_id_column_dropped_is_refused_never_sent_twice(
    ws: Workspace,
) -> None:
    """Three rows delivered with ids; the same rows without the id column, and a fourth:
    refused, nothing sent. The file as it was (with ids) sends the fourth alone; with
    --resend-changed the three would go again: the refusal names both ways."""
    receiver = Receiver()
    with receiving(receiver):
        _hooks(ws, receiver)
        again = _refused_then_sent_as_it_was(ws, receiver, lambda rows: rows, _without_ids)
        ws.write_csv("c.csv", _without_ids(make_rows(2)))  # u1, u2 without ids: forced
        forced = ws.invoke("send", "c.csv", "--channel", "hooks", "--resend-changed")
        assert forced.exit_code == 0, forced.output
        deliveries = receiver.deliveries()
    assert "3 row(s) already delivered" in again.output, again.output
    assert "2 row(s) with the content of rows" in forced.output, forced.output
    assert len(receiver.arrivals) == 6, deliveries


def test_a_row_open_with_an_id_refuses_the_file_without_ids_as_open(ws: Workspace) -> None:
    """The row with its id awaits approval in its run; the file without the id column is
    refused as open, --resend-changed or not: two runs never hold one notification open."""
    receiver = Receiver()
    with receiving(receiver):
        _hooks(ws, receiver)
        header, row = make_rows(1)
        ws.write_csv("b.csv", [header, row])
        first = ws.invoke("send", "b.csv", "--channel", "hooks", "--require-approval")
        assert first.exit_code == 0, first.output
        ws.write_csv("b.csv", _without_ids([header, row]))
        for extra in ([], ["--resend-changed"]):
            again = ws.invoke("send", "b.csv", "--channel", "hooks", *extra)
            assert again.exit_code == 2, again.output
            assert "still open" in again.output, again.output
    assert len(ws.ledger.runs()) == 1 and not receiver.arrivals


def test_an_id_less_row_is_held_only_by_the_content_it_was_delivered_with(
    ws: Workspace,
) -> None:
    """u1 was refused (400) with one text, then delivered, changed, with another: a file
    without ids whose row has the delivered text is refused; one whose row has the refused
    text is no delivered notification's twin, and is sent."""
    failing = {True}
    receiver = Receiver(answer=lambda item_id, n: 400 if failing else None)
    with receiving(receiver):
        _hooks(ws, receiver)
        header, row = make_rows(1)
        ws.write_csv("a.csv", [header, row])
        assert ws.invoke("send", "a.csv", "--channel", "hooks").exit_code == 3
        failing.clear()
        changed = [*row[:3], "Body of 1, amended", row[4]]
        ws.write_csv("a.csv", [header, changed])
        assert ws.invoke("send", "a.csv", "--channel", "hooks").exit_code == 0
        ws.write_csv("b.csv", _without_ids([header, changed]))
        held = ws.invoke("send", "b.csv", "--channel", "hooks")
        ws.write_csv("c.csv", _without_ids([header, row]))
        sent = ws.invoke("send", "c.csv", "--channel", "hooks")
        deliveries = receiver.deliveries()
    assert held.exit_code == 2, held.output
    assert sent.exit_code == 0, sent.output
    assert sum(deliveries.values()) == 2, deliveries
