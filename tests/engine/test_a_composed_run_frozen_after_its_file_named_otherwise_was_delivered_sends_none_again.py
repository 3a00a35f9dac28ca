"""A composed run stopped while drafting, frozen by `resume` after the same file named
otherwise (its `id` column dropped or added) delivered its rows meanwhile, plain or
composed, sends none of them again: the freeze (held_elsewhere) holds each row as a plan
holds one whose content a row named otherwise delivered (same_content). A composed row's
intent digest is its drafted text's: without an id it is held by its identity (its source
content), with one by its draft's source_digest. On both stores, through the CLI against the
fake Messages API."""

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
NO_IDS = [row[1:] for row in ROWS]


def _stopped_while_drafting(ws: Workspace, fake: FakeMessages, rows: list[list[str]]) -> str:
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    stopped = ws.invoke("send", str(ws.write_csv("a.csv", rows)), "--compose", str(brief(ws)))
    assert stopped.exit_code == 3, stopped.output
    fake.script.clear()
    return ws.ledger.run().run_id


def _each_once(ws: Workspace, run_a: str) -> None:
    states = [item.state for item in ws.ledger.items(run_a)]
    recipients = Counter(d["to"] for d in ws.outbox_documents())
    assert states == ["failed"] * 3, states
    assert set(recipients.values()) == {1}, recipients


def test_a_composed_run_frozen_after_the_file_with_ids_delivered_its_rows_sends_none_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A (no id column) stops while drafting; the file with an id column, sent plain,
    delivers every row; `resume A` must fail them all at the freeze: each once."""
    run_a = _stopped_while_drafting(ws, fake, NO_IDS)
    plain = ws.invoke("send", str(ws.write_csv("b.csv", ROWS)))
    assert plain.exit_code == 0, plain.output
    ws.invoke("resume", run_a)
    _each_once(ws, run_a)


def test_a_composed_run_with_ids_frozen_after_the_file_without_ids_was_sent_plain(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A (with ids) stops while drafting; the file sent plain without its id column
    delivers every row; `resume A` must fail them all at the freeze."""
    run_a = _stopped_while_drafting(ws, fake, ROWS)
    plain = ws.invoke("send", str(ws.write_csv("b.csv", NO_IDS)))
    assert plain.exit_code == 0, plain.output
    ws.invoke("resume", run_a)
    _each_once(ws, run_a)


def test_a_composed_run_with_ids_frozen_after_the_file_without_ids_was_composed(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A (with ids) stops while drafting; the file composed without its id column
    delivers every row; `resume A` must fail them all at the freeze."""
    run_a = _stopped_while_drafting(ws, fake, ROWS)
    composed = ws.invoke("send", str(ws.write_csv("b.csv", NO_IDS)), "--compose", str(brief(ws)))
    assert composed.exit_code == 0, composed.output
    ws.invoke("resume", run_a)
    _each_once(ws, run_a)
