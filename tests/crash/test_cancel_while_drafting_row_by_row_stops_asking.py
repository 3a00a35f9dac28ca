"""`notifier cancel` while a --compose run drafts one request per row (the Messages API) in
another process: that process starts no new request (each is paid for), waits for the
answers already requested and stores them, and lets the run go, so the cancel is confirmed
and the run ends cancelled with nothing sent. Drafting went on asking for every row of the
file and froze them before the cancel was seen."""

from __future__ import annotations

import pytest

from ..conftest import DB_ERRORS, Workspace, wait_for
from ..engine.test_compose import batch, brief
from ..fake_messages import FakeMessages
from .test_compose_interrupt import drafts_by_state, events, stored_drafts

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


def cancel_requested(ws: Workspace) -> bool:
    try:
        return bool(ws.query("SELECT 1 FROM runs WHERE cancel_requested_at IS NOT NULL"))
    except DB_ERRORS:
        return False


def test_cancel_while_drafting_row_by_row_asks_for_nothing_more(
    ws: Workspace, fake: FakeMessages
) -> None:
    fake.answer_limit = 2
    fake.answer_held = True
    process = ws.popen("send", str(batch(ws, 30)), "--compose", str(brief(ws)))
    wait_for(lambda: stored_drafts(ws) == 2 and fake.held == 4, "2 drafts stored, 4 held")
    cancel = ws.popen("cancel", "--wait", "60")
    wait_for(lambda: cancel_requested(ws), "the cancel recorded")
    wait_for(
        lambda: bool(events(ws, "drafting_cancelled")), "the drafting saw the cancel", timeout=30
    )
    fake.release.set()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 3, stderr
    assert "cancel requested while drafting" in stderr, stderr
    assert "resume" not in stderr, stderr
    _, said = cancel.communicate(timeout=60)
    assert cancel.returncode == 0, said
    assert len(fake.rows_requested()) == 6  # the 2 answered and the 4 in flight: no more
    assert len(drafts_by_state(ws)["drafted"]) == 6  # the 4 in flight, paid for, kept
    assert ws.status()["state"] == "cancelled"
    assert ws.outbox_documents() == []
