"""notifier cancel while Message Batches drafting runs in another process, or after that
process was killed: every batch it submitted is cancelled."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, wait_for
from ..engine import test_compose_batches
from ..engine.test_compose_batches import chunk_states, send
from ..fake_messages import FakeBatches

pytestmark = pytest.mark.both_stores
fake = test_compose_batches.fake  # a fixture of that module's, found here by name


def test_cancel_while_drafting_cancels_the_submitted_batches(
    ws: Workspace, fake: FakeBatches
) -> None:
    """`notifier cancel` while batches are processing: the drafting process cancels every
    submitted batch, records each chunk cancelled, and the run ends cancelled, nothing
    sent."""
    fake.polls_in_progress = 10**6
    process = ws.popen(*send(ws))
    wait_for(lambda: [s for _, s, _ in chunk_states(ws)] == ["submitted"] * 3, "3 submitted")
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 0, cancelled.output
    process.communicate(timeout=60)
    assert sorted(fake.cancelled) == sorted(fake.created())
    assert [s for _, s, _ in chunk_states(ws)] == ["canceled"] * 3
    assert ws.status()["state"] == "cancelled" and ws.outbox_documents() == []


def test_cancel_after_an_interrupted_drafting_cancels_the_batches_it_left(
    ws: Workspace, fake: FakeBatches
) -> None:
    """Drafting killed with batches submitted: `notifier cancel` itself cancels them."""
    fake.polls_in_progress = 10**6
    process = ws.popen(*send(ws))
    wait_for(lambda: [s for _, s, _ in chunk_states(ws)] == ["submitted"] * 3, "3 submitted")
    process.kill()
    process.communicate(timeout=60)
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 0, cancelled.output
    assert sorted(fake.cancelled) == sorted(fake.created())
    assert [s for _, s, _ in chunk_states(ws)] == ["canceled"] * 3


def test_a_cancel_while_drafting_the_api_does_not_answer_leaves_its_chunks_open(
    ws: Workspace, fake: FakeBatches
) -> None:
    """`notifier cancel` while batches are processing, every cancel answered 500: neither
    process claims a batch cancelled; each says which chunks stay open (exit 3), and the
    drafting process advises the cancel that finishes them."""
    fake.polls_in_progress = 10**6
    fake.cancel_status = 500
    process = ws.popen(*send(ws))
    wait_for(lambda: [s for _, s, _ in chunk_states(ws)] == ["submitted"] * 3, "3 submitted")
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 3, cancelled.output
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 3, stderr
    run_id = ws.ledger.run().run_id
    assert "the submitted batches were cancelled but for 3 chunk(s)" in stderr, stderr
    assert f"`notifier cancel {run_id}` again once the API can be reached" in stderr, stderr
    assert [s for _, s, _ in chunk_states(ws)] == ["submitted"] * 3
    assert ws.outbox_documents() == []
