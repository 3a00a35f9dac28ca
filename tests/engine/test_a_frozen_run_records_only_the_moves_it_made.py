"""The freeze of a composed run plans its rows and, in the same transaction, suppresses those
whose recipient went on the suppression list while it drafted and fails those whose draft
failed (or that another run delivered meanwhile). A row that is both is moved once: its
events say what its state is, so the run's chain replays to the rows as stored and `verify`
finds nothing (a `failed_at_freeze` event for a row left suppressed read as a rewritten
row). On both stores."""

from __future__ import annotations

from collections import deque

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, error, text_only_answer
from ..support.audited import verdicts
from .test_compose import batch, brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_row_suppressed_while_drafting_whose_draft_failed_verifies_as_stored(
    ws: Workspace, fake: FakeMessages
) -> None:
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    stopped = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))
    assert stopped.exit_code == 3, stopped.output
    fake.script.clear()
    assert ws.invoke("suppress", "add", "user2@example.com").exit_code == 0
    fake.per_row["u2"] = deque([text_only_answer()] * 10)
    resumed = ws.invoke("resume")
    assert resumed.exit_code in (0, 3), resumed.output
    states = {item.item_id: item.state for item in ws.ledger.items()}
    assert states["u2"] in ("suppressed", "failed"), states
    (found,) = verdicts(ws).values()
    assert found.findings == (), found.findings
