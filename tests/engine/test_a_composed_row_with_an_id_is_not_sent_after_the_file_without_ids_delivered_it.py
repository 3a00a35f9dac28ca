"""A composed row with an id (identity `id:u1`; its intent digest that of the drafted text) is
the row of its channel and source content that the same file, sent meanwhile without its
`id` column, delivered: the file names its rows otherwise, so the freeze (held_elsewhere)
must hold it as the plan holds a row with an id whose content an id-less row delivered
(same_content), never send it a second time. The mirror of
test_a_composed_row_without_an_id_is_not_sent_after_the_file_with_ids_delivered_it. On both
stores, through the CLI against the fake Messages API."""

from __future__ import annotations

from collections import Counter

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, error
from .test_compose import brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]

ROWS = [["id", "to", "name", "plan"]] + [
    [f"u{i}", f"user{i}@example.com", f"User {i}", "pro"] for i in range(1, 4)
]


def _stopped_while_drafting(ws: Workspace, fake: FakeMessages) -> str:
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    stopped = ws.invoke("send", str(ws.write_csv("a.csv", ROWS)), "--compose", str(brief(ws)))
    assert stopped.exit_code == 3, stopped.output
    fake.script.clear()
    return ws.ledger.run().run_id


def _each_once(ws: Workspace, run_a: str) -> None:
    states = [item.state for item in ws.ledger.items(run_a)]
    recipients = Counter(d["to"] for d in ws.outbox_documents())
    assert states == ["failed"] * 3, states
    assert set(recipients.values()) == {1}, recipients


def test_a_composed_run_with_ids_frozen_after_the_file_without_ids_was_sent_plain(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A (with ids) stops while drafting; the file sent plain without its id column
    delivers every row; `resume A` must fail them all at the freeze."""
    run_a = _stopped_while_drafting(ws, fake)
    plain = ws.invoke("send", str(ws.write_csv("b.csv", [row[1:] for row in ROWS])))
    assert plain.exit_code == 0, plain.output
    ws.invoke("resume", run_a)
    _each_once(ws, run_a)


def test_a_composed_run_with_ids_frozen_after_the_file_without_ids_was_composed(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A (with ids) stops while drafting; the file composed without its id column
    delivers every row; `resume A` must fail them all at the freeze."""
    run_a = _stopped_while_drafting(ws, fake)
    no_ids = ws.write_csv("b.csv", [row[1:] for row in ROWS])
    composed = ws.invoke("send", str(no_ids), "--compose", str(brief(ws)))
    assert composed.exit_code == 0, composed.output
    ws.invoke("resume", run_a)
    _each_once(ws, run_a)
