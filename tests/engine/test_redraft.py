"""`notifier redraft [RUN_ID] --item ID…` drafts selected rows of a --compose run
awaiting approval again: only those rows are requested, their intents are recomputed (new
digest, same key), the run's fingerprint changes, the old fingerprint and any approval
bound to the old state are refused, and the new fingerprint is approved and sent. Refused
(exit 2, nothing changed) for a run not awaiting approval or a row the run does not have."""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from typing import Any

import pytest

from notifier.content import redraft as redraft_module
from notifier.store import LostRace, Store

from ..conftest import Workspace
from ..fake_messages import FakeMessages, text_only_answer, tool_answer
from .test_compose import batch, brief

pytestmark = pytest.mark.both_stores


def awaiting(ws: Workspace, fake: FakeMessages, n: int = 4, exit_code: int = 0) -> str:
    """A --compose run of `n` rows awaiting approval; its fingerprint (exit 3 when a
    draft failed)."""
    sent = ws.invoke("send", str(batch(ws, n)), "--compose", str(brief(ws)), "--require-approval")
    assert sent.exit_code == exit_code, sent.output
    found = re.search(r"fingerprint: (sha256:[0-9a-f]+)", sent.output)
    assert found is not None, sent.output
    return found.group(1)


def intents(ws: Workspace) -> dict[str, tuple[str, str, str]]:
    """item id: (idempotency key, intent digest, state)."""
    return {i.item_id: (i.idempotency_key, i.intent_digest, i.state) for i in ws.ledger.items()}


def run_fingerprint(ws: Workspace) -> str:
    return str(ws.ledger.run().fingerprint)


def test_redraft_requests_only_the_named_rows_and_the_new_fingerprint_must_be_approved(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Redrafting u2 and u4: only they are requested again, once each; their digests change,
    no key changes; the fingerprint changes; the old one is refused (exit 4), the new one
    approved and sent with the new drafts, without another request; the redraft is
    audited and its tokens added to the rows'."""
    old = awaiting(ws, fake)
    before = intents(ws)
    fake.per_row["u2"] = deque([tool_answer("Fresh u2", "New body for u2.")])
    fake.per_row["u4"] = deque([tool_answer("Fresh u4", "New body for u4.")])
    mark = len(fake.requests)

    result = ws.invoke("redraft", "--item", "u2", "--item", "u4")
    assert result.exit_code == 0, result.output
    assert Counter(r.row_id for r in fake.requests[mark:]) == {"u2": 1, "u4": 1}
    new = run_fingerprint(ws)
    assert new != old and "fingerprint changed" in result.output
    # The fingerprint to approve is shown only by `preview`, after what it covers.
    assert new not in result.output and "notifier preview run-" in result.output
    after = intents(ws)
    assert {i: k for i, (k, _, _) in after.items()} == {i: k for i, (k, _, _) in before.items()}
    changed = {i for i in after if after[i][1] != before[i][1]}
    assert changed == {"u2", "u4"}
    [event] = ws.ledger.events("redraft")
    audit = json.loads(event.detail or "{}")
    assert audit["fingerprint_before"] == old and audit["fingerprint"] == new
    assert audit["rows"] == [2, 4] and audit["operator"]
    drafts = ws.ledger.draft_by_seq()
    assert (drafts[1][2], drafts[2][2]) == (11, 22)

    refused = ws.invoke("approve", "--fingerprint", old)
    assert refused.exit_code == 4, refused.output
    assert new not in refused.output
    assert ws.invoke("approve", "--fingerprint", new).exit_code == 0
    mark = len(fake.requests)
    sent = ws.invoke("resume")
    assert sent.exit_code == 0, sent.output
    assert len(fake.requests) == mark
    subjects = {d["item_id"]: d["subject"] for d in ws.outbox_documents()}
    assert subjects == {"u1": "Draft u1", "u2": "Fresh u2", "u3": "Draft u3", "u4": "Fresh u4"}


def test_an_approval_bound_to_the_state_before_a_redraft_is_refused(
    ws: Workspace, fake: FakeMessages
) -> None:
    """An approval under way when a redraft lands (state version read before it) is not
    recorded: the approval binds to the state version, which the redraft moved."""
    awaiting(ws, fake)
    store = Store.open(ws.db)
    try:
        [run] = store.core.runs()
        version = store.ledger.state_version(run.run_id)
        assert ws.invoke("redraft", "--item", "u1").exit_code == 0
        approval = {
            "operator": "someone",
            "approved_at": "2030-01-01T00:00:00+00:00",
            "expires_at": "2030-01-02T00:00:00+00:00",
            "fingerprint": run.fingerprint,
            "state_version": version,
        }
        with pytest.raises(LostRace):
            store.ledger.record_approval(run.run_id, approval, version)
    finally:
        store.close()
    stored = ws.ledger.run()
    assert (stored.state, stored.approval) == ("awaiting_approval", None)


def test_a_redraft_that_loses_its_race_to_an_approval_is_refused_changing_nothing(
    ws: Workspace, fake: FakeMessages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Approved by another command while its new drafts were being asked for, the redraft
    writes nothing (its write is conditional on the run it read) and exits 4, saying what
    happened and where to look."""
    old = awaiting(ws, fake, 2)
    asking = redraft_module.ask

    def approved_meanwhile(*args: Any, **kwargs: Any) -> Any:
        assert ws.invoke("approve", "--fingerprint", old).exit_code == 0
        return asking(*args, **kwargs)

    monkeypatch.setattr(redraft_module, "ask", approved_meanwhile)
    lost = ws.invoke("redraft", "--item", "u1")
    assert lost.exit_code == 4, lost.output
    assert "changed while it was being redrafted" in lost.output
    assert "another command approved, rejected or redrafted it" in lost.output
    assert "`notifier status` shows where it stands" in lost.output
    assert (ws.ledger.run().state, run_fingerprint(ws)) == ("approved", old)
    assert ws.ledger.events("redraft") == []


def test_redraft_is_refused_for_an_unknown_item_or_a_run_not_awaiting_approval(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Exit 2, nothing requested and nothing changed: a row id the run does not have (named,
    with where to find the ids), a run already approved (naming cancel), a run that sent."""
    old = awaiting(ws, fake, 2)
    mark = len(fake.requests)
    unknown = ws.invoke("redraft", "--item", "u1", "--item", "nope")
    assert unknown.exit_code == 2, unknown.output
    assert "has no row with id 'nope'" in unknown.output and "notifier preview" in unknown.output
    assert ws.invoke("approve", "--fingerprint", old).exit_code == 0
    approved = ws.invoke("redraft", "--item", "u1")
    assert approved.exit_code == 2, approved.output
    assert "is approved, not awaiting approval" in approved.output
    assert "notifier cancel" in approved.output
    assert ws.invoke("resume").exit_code == 0
    completed = ws.invoke("redraft", "--item", "u1")
    assert completed.exit_code == 2, completed.output
    assert "is completed, not awaiting approval" in completed.output
    assert len(fake.requests) == mark and run_fingerprint(ws) == old
    assert ws.ledger.events("redraft") == []


def test_a_row_whose_draft_failed_is_planned_again_by_a_redraft(
    ws: Workspace, fake: FakeMessages
) -> None:
    """u2's first answer is unusable (failed, not planned to send); redrafting it plans it
    (pending, counted), and the approved run sends all three."""
    fake.per_row["u2"] = deque([text_only_answer()])
    awaiting(ws, fake, 3, exit_code=3)
    assert intents(ws)["u2"][2] == "failed"
    result = ws.invoke("redraft", "--item", "u2")
    assert result.exit_code == 0, result.output
    assert intents(ws)["u2"][2] == "pending"
    assert ws.status()["counts"]["failed"] == 0
    assert ws.invoke("approve", "--fingerprint", run_fingerprint(ws)).exit_code == 0
    assert ws.invoke("resume").exit_code == 0
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == ["u1", "u2", "u3"]


def test_a_redraft_whose_answer_fails_keeps_the_old_draft_and_exits_3(
    ws: Workspace, fake: FakeMessages
) -> None:
    """The new draft of u1 is unusable: u1 keeps its draft, the fingerprint stands, exit 3."""
    old = awaiting(ws, fake, 2)
    fake.per_row["u1"] = deque([text_only_answer()])
    result = ws.invoke("redraft", "--item", "u1")
    assert result.exit_code == 3, result.output
    assert "keeps the draft it had" in result.output
    assert run_fingerprint(ws) == old
    assert ws.ledger.draft_by_seq()[1][:2] == ("drafted", "Draft u1")
