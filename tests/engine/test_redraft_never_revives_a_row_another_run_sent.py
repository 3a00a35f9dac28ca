"""`redraft` plans a row again (failed → pending) only if no other run delivered it (whatever
its content), abandoned it or holds it: a row whose first draft failed, or that was failed at
the freeze because another run had delivered it meanwhile, may have been sent by the same
file sent again since. Refused then (exit 4), before anything is drafted, nothing changed;
the row stays failed and is delivered once. Through the CLI against the fake Messages API."""

from __future__ import annotations

import re
from collections import Counter, deque

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, error, text_only_answer
from .test_compose import batch, brief

pytestmark = pytest.mark.both_stores


def _approve(ws: Workspace, run_id: str) -> None:
    preview = ws.invoke("preview", run_id)
    fingerprint = re.findall(r"sha256:[0-9a-f]{64}", preview.output)[-1]
    approved = ws.invoke("approve", run_id, "--fingerprint", fingerprint)
    assert approved.exit_code == 0, approved.output


def test_a_row_whose_draft_failed_and_that_the_file_sent_again_delivered_is_not_redrafted(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A's only draft comes back unusable (the row fails: "will not be sent"); the file
    is sent again as run B, approved and delivered. `redraft A --item u1` is refused naming
    run B, nothing is asked of the API, and A's row stays failed: u1 is delivered once."""
    fake.per_row["u1"] = deque([text_only_answer()])
    csv = str(batch(ws, 1))
    first = ws.invoke("send", csv, "--compose", str(brief(ws)), "--require-approval")
    assert first.exit_code == 3, first.output
    [run_a] = [run.run_id for run in ws.ledger.runs()]
    assert ws.ledger.item("u1", run_a).state == "failed"
    again = ws.invoke("send", csv, "--compose", str(brief(ws)), "--require-approval")
    assert again.exit_code == 0, again.output
    [run_b] = [run.run_id for run in ws.ledger.runs() if run.run_id != run_a]
    _approve(ws, run_b)
    assert ws.invoke("resume", run_b).exit_code == 0
    asked = len(fake.requests)

    redrafted = ws.invoke("redraft", run_a, "--item", "u1")

    assert redrafted.exit_code == 4, redrafted.output
    assert f"u1 (run {run_b})" in redrafted.output, redrafted.output
    assert len(fake.requests) == asked, "nothing drafted for a row it would refuse"
    assert ws.ledger.item("u1", run_a).state == "failed"
    assert ws.ledger.run(run_a).state == "awaiting_approval"
    assert Counter(d["item_id"] for d in ws.outbox_documents()) == {"u1": 1}


def test_a_row_failed_at_the_freeze_as_delivered_by_another_run_is_not_redrafted(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Run A stops while drafting (the API refuses the key); the file sent plain as run B
    delivers every row; `resume A` freezes them all failed ("run B delivered this row").
    `redraft A --item u1` is refused: every row is delivered once."""
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    csv = str(batch(ws, 3))
    stopped = ws.invoke("send", csv, "--compose", str(brief(ws)), "--require-approval")
    assert stopped.exit_code == 3, stopped.output
    run_a = ws.ledger.run().run_id
    plain = ws.invoke("send", csv)
    assert plain.exit_code == 0, plain.output
    fake.script.clear()
    ws.invoke("resume", run_a)
    assert {item.state for item in ws.ledger.items(run_a)} == {"failed"}

    redrafted = ws.invoke("redraft", run_a, "--item", "u1")

    assert redrafted.exit_code == 4, redrafted.output
    assert "u1 (run " in redrafted.output, redrafted.output
    assert {item.state for item in ws.ledger.items(run_a)} == {"failed"}
    assert Counter(d["item_id"] for d in ws.outbox_documents()) == {"u1": 1, "u2": 1, "u3": 1}
