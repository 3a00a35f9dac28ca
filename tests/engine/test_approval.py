"""Approvals: `send --require-approval` stops before sending; `approve` binds the fingerprint;
`resume` sends only what was approved, recomputing the fingerprint from the stored intents;
an approval recorded against a state another approval has since changed is refused."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from click.testing import Result

from notifier.domain import clock
from notifier.domain.intent import canonical_json, intent_digest
from notifier.domain.records import Run
from notifier.ops import approval as approval_module
from notifier.store import Store

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke


def plan_for_approval(ws: Workspace, n: int = 4) -> tuple[str, str]:
    """Plan `n` rows with --require-approval; returns (run_id, printed fingerprint)."""
    batch = ws.write_csv("b.csv", make_rows(n))
    result = ws.invoke("send", str(batch), "--require-approval")
    assert result.exit_code == 0, result.output
    run_id = re.search(r"planned run (\S+):", result.output)
    fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", result.output)
    assert run_id and fingerprint, result.output
    return run_id.group(1), fingerprint.group(1)


def test_require_approval_stores_the_plan_previews_it_and_sends_nothing(ws: Workspace) -> None:
    """The run waits in awaiting_approval; the preview shows counts per channel and the first
    rows exactly as stored; nothing is sent."""
    batch = ws.write_csv("b.csv", make_rows(5))
    result = ws.invoke("send", str(batch), "--require-approval")
    assert result.exit_code == 0, result.output
    assert "preview: 5 notifications (outbox: 5)" in result.output
    assert "subject: Hello 1" in result.output and "body:    Body of 3" in result.output
    assert "Hello 4" not in result.output
    assert "notifier approve" in result.output
    assert ws.ledger.run().state == "awaiting_approval"
    assert ws.outbox_documents() == []


def test_resume_refuses_a_run_awaiting_approval_and_names_a_command_that_exists(
    ws: Workspace,
) -> None:
    """`resume` of an unapproved run exits 4 sending nothing, and the `notifier preview`
    command it names ends with the fingerprint its `notifier approve` command takes."""
    run_id, fingerprint = plan_for_approval(ws)
    refused = ws.invoke("resume")
    assert refused.exit_code == 4, refused.output
    assert fingerprint not in refused.output and f"notifier preview {run_id}" in refused.output
    assert ws.outbox_documents() == []
    command = re.search(r"`notifier (preview [^`]+)`", refused.output)
    assert command is not None
    shown = ws.invoke(*command.group(1).split())
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[-1] == f"fingerprint: {fingerprint}"
    approve = re.search(r"`notifier (approve \S+ --fingerprint) sha256:…`", refused.output)
    assert approve is not None
    approved = ws.invoke(*approve.group(1).split(), fingerprint)
    assert approved.exit_code == 0, approved.output


def test_approve_with_the_right_fingerprint_records_the_audit_and_lets_resume_send(
    ws: Workspace,
) -> None:
    """The approval records operator, times, fingerprint and state version; resume sends all."""
    run_id, fingerprint = plan_for_approval(ws)
    version = max(ws.ledger.event_numbers(run_id))
    result = ws.invoke(
        "approve",
        run_id,
        "--fingerprint",
        fingerprint,
        "--expires-in",
        "1h",
        env={"USER": "alice"},
    )
    assert result.exit_code == 0, result.output
    run = ws.ledger.run()
    state, raw = run.state, run.approval
    record = raw if isinstance(raw, dict) else json.loads(str(raw))
    assert state == "approved"
    assert record["operator"] == "alice" and record["fingerprint"] == fingerprint
    assert record["state_version"] == version
    assert record["expires_at"] > record["approved_at"]
    events = ws.ledger.events("run_approve")
    assert len(events) == 1 and "alice" in str(events[0].detail)
    sent = ws.invoke("resume")
    assert sent.exit_code == 0, sent.output
    assert len(ws.outbox_documents()) == 4


def test_approve_with_a_wrong_fingerprint_is_refused(ws: Workspace) -> None:
    """A fingerprint that is not the run's is refused with exit 4 and approves nothing."""
    run_id, _ = plan_for_approval(ws)
    wrong = "sha256:" + "0" * 64
    result = ws.invoke("approve", run_id, "--fingerprint", wrong)
    assert result.exit_code == 4, result.output
    run = ws.ledger.run()
    assert (run.state, run.approval) == ("awaiting_approval", None)
    assert ws.invoke("resume").exit_code == 4
    assert ws.outbox_documents() == []


def test_an_expired_approval_is_refused_by_resume(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its expiry an approval no longer lets resume send anything (exit 4)."""
    run_id, fingerprint = plan_for_approval(ws)
    result = ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", "1s")
    assert result.exit_code == 0, result.output
    # Resume (in this process) runs 2 s in the future: past the 1 s expiry, whatever the time.
    real_now = clock.now
    with monkeypatch.context() as later:
        later.setattr(clock, "now", lambda: real_now() + timedelta(seconds=2))
        refused = ws.invoke("resume")
    assert refused.exit_code == 4, refused.output
    assert "expired" in refused.output
    assert ws.outbox_documents() == []
    again = ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", "1h")
    assert again.exit_code == 0, again.output
    assert ws.invoke("resume").exit_code == 0
    assert len(ws.outbox_documents()) == 4


def test_intents_tampered_with_after_approval_are_refused(ws: Workspace) -> None:
    """Changing a stored intent after approval — even with its digest and the runs row's
    fingerprint rewritten to match — makes resume refuse (exit 4) and send nothing."""
    run_id, fingerprint = plan_for_approval(ws)
    assert ws.invoke("approve", run_id, "--fingerprint", fingerprint).exit_code == 0
    item = ws.ledger.items()[1]  # seq 2
    channel, target, payload = item.channel, item.target, ws.ledger.payload(2)
    payload["body"] = "Click here: http://evil.example"
    ws.forge.intent(2, canonical_json(payload), intent_digest(channel, target, payload))
    ws.forge.run_fingerprint("sha256:forged")
    refused = ws.invoke("resume")
    assert refused.exit_code == 4, refused.output
    assert "changed after approval" in refused.output
    assert ws.outbox_documents() == []


def test_a_missing_approval_record_is_never_read_as_approved(ws: Workspace) -> None:
    """A run in `approved` whose approval record is gone (or garbled) is refused (exit 4)."""
    run_id, fingerprint = plan_for_approval(ws)
    assert ws.invoke("approve", run_id, "--fingerprint", fingerprint).exit_code == 0
    ws.forge.approval(None)
    assert ws.invoke("resume").exit_code == 4
    ws.forge.approval('{"operator": "x"}')
    assert ws.invoke("resume").exit_code == 4
    assert ws.outbox_documents() == []


def _untouched_by_a_start(ws: Workspace) -> list[list[tuple[object, ...]]]:
    """Everything a start writes: the runs row (state, lease, stop reason), its events, the
    worker leases, the items and their attempts."""
    return [
        ws.ledger.rows(table, order)
        for table, order in (
            ("runs", "run_id"),
            ("events", "run_id, seq_no"),
            ("workers", "worker_id"),
            ("items", "run_id, seq"),
            ("attempts", "id"),
        )
    ]


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_an_expired_approval_is_refused_at_start_with_the_run_untouched(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resume` (at N = 1 and N = 8) and, where runs are shared, `worker` of an approved run
    whose approval has expired exit 4 before taking a lease or moving the run: it is still
    `approved`, its events, leases and items as they were, nothing sent, and the refusal
    names the expiry and the `notifier approve` command that renews it."""
    run_id, fingerprint = plan_for_approval(ws)
    approved = ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", "1h")
    assert approved.exit_code == 0, approved.output
    before = _untouched_by_a_start(ws)
    # Each command runs two hours on (the clock's test shift): past the expiry, however
    # loaded.
    monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))
    commands = [["resume", run_id], ["resume", run_id, "--concurrency", "8"]]
    if ws.store == "postgres":
        commands.append(["worker", run_id, "--concurrency", "8"])
    for command in commands:
        refused = ws.invoke(*command)
        said = refused.output
        assert refused.exit_code == 4, (command, said)
        assert "expired" in said and f"notifier approve {run_id}" in said, (command, said)
        assert "Traceback" not in said, (command, said)
        assert fingerprint not in said, (command, said)
        assert ws.ledger.run().state == "approved", command
        assert _untouched_by_a_start(ws) == before, command
    assert ws.outbox_documents() == []


def test_status_and_runs_show_an_expired_approval_as_expired(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approved run whose approval has expired is shown so, with its expiry, by `status`
    (table and JSON) and by `runs`, not as plainly `approved`."""
    run_id, fingerprint = plan_for_approval(ws)
    assert ws.invoke("approve", "--fingerprint", fingerprint, "--expires-in", "1h").exit_code == 0
    fresh = json.loads(ws.invoke("status", "--json").output)
    assert fresh["state"] == "approved" and fresh["approval_expired_at"] is None
    monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))  # past the expiry
    status = ws.invoke("status")
    assert "approval: expired at" in status.output, status.output
    data = json.loads(ws.invoke("status", "--json").output)
    assert data["approval_expired_at"] == data["approval"]["expires_at"]
    runs = json.loads(ws.invoke("runs", "--json").output)["runs"]
    assert [(r["run_id"], r["state"], r["approval_expired_at"]) for r in runs] == [
        (run_id, "approved", data["approval_expired_at"])
    ]
    assert "approval expired" in ws.invoke("runs").output


@pytest.mark.both_stores
def test_an_approval_bound_to_a_stale_state_version_is_refused(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approval recorded against a stale state version is refused (exit 4), nothing kept."""
    run_id, fingerprint = plan_for_approval(ws)
    original = approval_module.recompute_fingerprint
    competing: list[Result] = []
    alices: list[bool] = []  # bob's command, in-process, passes here too: it lands once

    def then_another_operator_approves(store: Store, run: Run) -> str:
        # Between alice's read of the state version and her record: bob's approval lands.
        actual = original(store, run)
        if not alices:
            alices.append(True)
            competing.append(  # bob's command, run in the middle of alice's
                ws.invoke("approve", run_id, "--fingerprint", fingerprint, env={"USER": "bob"})
            )
        return actual

    monkeypatch.setattr(approval_module, "recompute_fingerprint", then_another_operator_approves)
    stale = ws.invoke("approve", run_id, "--fingerprint", fingerprint, env={"USER": "alice"})
    monkeypatch.setattr(approval_module, "recompute_fingerprint", original)

    (bob,) = competing
    assert bob.exit_code == 0, bob.output
    assert stale.exit_code == 4, stale.output
    assert "changed while it was being approved" in stale.output
    run = ws.ledger.run()
    state, raw = run.state, run.approval
    record = raw if isinstance(raw, dict) else json.loads(str(raw))
    assert state == "approved" and record["operator"] == "bob"
    kinds = [e.kind for e in ws.ledger.events() if "approv" in e.kind]
    assert sorted(kinds) == ["run_approve", "run_request_approval"]
    # Bob's approval is intact: the run sends on it.
    sent = ws.invoke("resume")
    assert sent.exit_code == 0, sent.output
    assert ws.ledger.state_counts() == {"sent": 4}


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_the_advice_after_intents_changed_mid_run_never_sends_a_delivered_row_again(
    ws: Workspace,
) -> None:
    """An approved run stops after delivering two of its four rows (a crash); one of the
    rows left is then changed in the database. `resume` refuses (exit 4), and its advice,
    followed word for word, plans only the rows not delivered, for a review: each row is
    delivered once, the changed one never as changed."""
    run_id, fingerprint = plan_for_approval(ws)
    assert ws.invoke("approve", run_id, "--fingerprint", fingerprint).exit_code == 0
    crash_invoke(ws, "after-receipt:2", "resume", run_id)
    item = ws.ledger.items()[3]  # seq 4, never attempted
    payload = ws.ledger.payload(4)
    payload["body"] = "Click here: http://evil.example"
    ws.forge.intent(4, canonical_json(payload), intent_digest(item.channel, item.target, payload))
    refused = ws.invoke("resume", run_id)
    assert refused.exit_code == 4, refused.output
    assert "--new-run" not in refused.output
    advice = re.findall(r"`(notifier [^`]+)`", refused.output)
    assert advice, refused.output
    for command in advice:
        words = command.split()[1:]
        followed = ws.invoke(*(w.replace("BATCH.csv", "b.csv") for w in words))
        assert followed.exit_code in (0, 3), (command, followed.output)
    (again,) = [r for r in ws.ledger.runs() if r.run_id != run_id]
    shown = ws.invoke("preview", again.run_id)
    new_fp = re.search(r"fingerprint: (sha256:[0-9a-f]+)", shown.output)
    assert new_fp, shown.output
    assert ws.invoke("approve", again.run_id, "--fingerprint", new_fp.group(1)).exit_code == 0
    assert ws.invoke("resume", again.run_id).exit_code == 0
    delivered = sorted(d["item_id"] for d in ws.outbox_documents())
    assert delivered == ["u1", "u2", "u3", "u4"]
    assert "evil.example" not in json.dumps(ws.outbox_documents())
