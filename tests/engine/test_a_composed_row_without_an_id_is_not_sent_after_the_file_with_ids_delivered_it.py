"""A composed row without an id (its identity is its source row's digest; its intent digest
that of the drafted text) is the same notification as a row with an id of its channel and
source content, delivered meanwhile by the file sent plain with an `id` column added: the
freeze (held_elsewhere) and `redraft` (held_by_other_runs) must hold it as they hold a
plain row without an id (same_content), never send it a second time. On both stores,
through the CLI against the fake Messages API."""

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


def test_a_composed_run_frozen_after_the_file_with_ids_delivered_its_rows_sends_none_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A (no id column) stops while drafting; the file with an id column, sent plain,
    delivers every row; `resume A` must fail them all at the freeze: each once."""
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    no_ids = str(ws.write_csv("a.csv", [row[1:] for row in ROWS]))
    stopped = ws.invoke("send", no_ids, "--compose", str(brief(ws)))
    assert stopped.exit_code == 3, stopped.output
    run_a = ws.ledger.run().run_id
    plain = ws.invoke("send", str(ws.write_csv("b.csv", ROWS)))
    assert plain.exit_code == 0, plain.output
    fake.script.clear()
    ws.invoke("resume", run_a)
    states = [item.state for item in ws.ledger.items(run_a)]
    recipients = Counter(d["to"] for d in ws.outbox_documents())
    assert states == ["failed"] * 3, states
    assert set(recipients.values()) == {1}, recipients
