"""Drafting (send --compose) killed (-9) or interrupted (Ctrl-C): the drafts received are kept,
and resume never asks for a stored draft again."""

from __future__ import annotations

import signal

from ..conftest import Workspace, wait_for
from ..engine.test_compose import batch, brief, drafted_rows, sigint_pending
from ..fake_messages import FakeMessages


def test_kill_9_mid_drafting_then_resume_never_requests_a_stored_draft_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    """SIGKILL after two drafts are stored: resume drafts only the other rows (the fake sees
    no second request for a drafted row), then sends all of them once."""
    fake.answer_limit = 2
    process = ws.popen("send", str(batch(ws, 6)), "--compose", str(brief(ws)))
    wait_for(lambda: len(drafted_rows(ws)) >= 2, "two drafts stored")
    drafted = drafted_rows(ws)
    assert len(drafted) == 2
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    before = {row[0] for row in drafted}
    mark = len(fake.requests)
    fake.answer_limit = None
    fake.release.set()

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    again = [r.row_id for r in fake.requests[mark:]]
    assert not before & set(again), f"drafted rows {before} were requested again: {again}"
    assert sorted(again) == sorted({f"u{i}" for i in range(1, 7)} - before)
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == [f"u{i}" for i in range(1, 7)]


def test_ctrl_c_while_drafting_exits_130_keeping_the_drafts_made(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Ctrl-C mid-drafting stops new requests and retries, exits 130 with the drafts made
    stored and nothing sent; resume drafts only the rest."""
    fake.answer_limit = 1
    process = ws.popen("send", str(batch(ws, 5)), "--compose", str(brief(ws)))
    wait_for(lambda: len(drafted_rows(ws)) >= 1, "a draft stored")
    drafted = drafted_rows(ws)
    assert len(drafted) == 1
    process.send_signal(signal.SIGINT)
    # The process has taken the signal before the held requests are answered (so their
    # failures meet a stopped drafter, not a retry).
    wait_for(lambda: not sigint_pending(process.pid), "the SIGINT taken")
    fake.release.set()  # the held requests now fail with a 500, which is not retried
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted while drafting" in stderr
    assert [d["state"] for d in ws.ledger.drafts()].count("drafted") == 1
    assert ws.outbox_documents() == []
    mark = len(fake.requests)
    fake.answer_limit = None
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert drafted[0][0] not in [r.row_id for r in fake.requests[mark:]]
    assert len(ws.outbox_documents()) == 5
