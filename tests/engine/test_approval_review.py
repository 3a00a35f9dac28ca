"""Approvals that can't be given blind: `approve --fingerprint` approves the run the
fingerprint belongs to, no refusal prints a fingerprint to paste, `preview` shows every
notification and ends with the fingerprint of what it showed, `reject` closes a run with its
audit, an approval lasts at most 30 days, and the operator is known without $USER."""

from __future__ import annotations

import csv
import io
import json
import os
import pwd
import re
from datetime import timedelta

import pytest

from notifier.domain import clock
from notifier.domain.intent import canonical_json, intent_digest, run_fingerprint

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.both_stores

# A whole fingerprint, as a refusal must never print one.
FULL_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")


def plan(ws: Workspace, name: str, rows: list[list[str]]) -> str:
    """Plan `rows` from file `name` with --require-approval; returns the run id."""
    batch = ws.write_csv(name, rows)
    result = ws.invoke("send", str(batch), "--require-approval")
    assert result.exit_code == 0, result.output
    found = re.search(r"planned run (\S+):", result.output)
    assert found, result.output
    return found.group(1)


def reviewed_fingerprint(ws: Workspace, run_id: str) -> str:
    """The fingerprint on the last line of `notifier preview RUN`, as a reviewer takes it."""
    result = ws.invoke("preview", run_id)
    assert result.exit_code == 0, result.output
    last = result.stdout.splitlines()[-1]
    assert last.startswith("fingerprint: sha256:"), result.stdout
    return last.removeprefix("fingerprint: ")


def stored_fingerprint(ws: Workspace, run_id: str) -> str:
    """The fingerprint stored when the run was planned (what `send` printed)."""
    return str(ws.ledger.run(run_id).fingerprint)


def tamper(ws: Workspace, run_id: str, seq: int) -> None:
    """Rewrite a stored intent (its digest made to match), as someone with database access
    could."""
    item = next(i for i in ws.ledger.items(run_id) if i.seq == seq)
    channel, target = item.channel, item.target
    payload = ws.ledger.payload(seq, run_id)
    payload["body"] = "Click here: http://evil.example"
    ws.forge.intent(seq, canonical_json(payload), intent_digest(channel, target, payload), run_id)


def current_fingerprint(ws: Workspace, run_id: str) -> str:
    """The fingerprint the run's stored intents hash to now (what pasting would approve)."""
    digests = [i.intent_digest for i in ws.ledger.items(run_id)]
    return run_fingerprint(digests, ws.ledger.channel_snapshot(run_id))


def test_two_awaiting_runs_are_each_approved_by_their_own_fingerprint(ws: Workspace) -> None:
    """With two runs awaiting approval, `approve --fingerprint F` (no RUN_ID) approves the
    run whose fingerprint F is, the older one too, and never checks F against another run."""
    first = plan(ws, "a.csv", make_rows(3))
    second = plan(ws, "b.csv", make_rows(3, start=4))
    first_fp, second_fp = stored_fingerprint(ws, first), stored_fingerprint(ws, second)
    assert first_fp != second_fp
    approved = ws.invoke("approve", "--fingerprint", first_fp, env={"USER": "alice"})
    assert approved.exit_code == 0, approved.output
    assert f"run {first} approved by alice" in approved.output
    states = {run.run_id: run.state for run in ws.ledger.runs()}
    assert states == {first: "approved", second: "awaiting_approval"}
    approved = ws.invoke("approve", "--fingerprint", second_fp, env={"USER": "bob"})
    assert approved.exit_code == 0, approved.output
    records = {run_id: ws.ledger.approval(run_id) or {} for run_id in (first, second)}
    assert (records[first]["fingerprint"], records[first]["operator"]) == (first_fp, "alice")
    assert (records[second]["fingerprint"], records[second]["operator"]) == (second_fp, "bob")
    # With RUN_ID, the fingerprint must be that run's.
    third = plan(ws, "c.csv", make_rows(2, start=7))
    refused = ws.invoke("approve", third, "--fingerprint", first_fp)
    assert refused.exit_code == 4, refused.output
    assert ws.ledger.run(third).state == "awaiting_approval"


def test_a_refusal_never_prints_a_fingerprint_to_paste(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume, send, approve and preview refuse an awaiting, expired or changed run (exit 4)
    without printing any whole fingerprint: they say what changed and point to `notifier
    preview RUN`."""
    run_id = plan(ws, "b.csv", make_rows(4))
    fingerprint = stored_fingerprint(ws, run_id)
    refusals: list[tuple[str, str]] = []  # (everything printed, the refusal on stderr)

    def refused(*args: str) -> str:
        result = ws.invoke(*args)
        assert result.exit_code == 4, result.output
        refusals.append((result.output, result.stderr))
        return result.output

    assert f"notifier preview {run_id}" in refused("resume")
    refused("resume", run_id)
    assert "another run's preview" in refused(
        "approve", run_id, "--fingerprint", "sha256:" + "0" * 64
    )
    refused("approve", "--fingerprint", "sha256:" + "1" * 64)
    # Sending the same file again while it waits names the run, never its fingerprint.
    again = ws.invoke("send", "b.csv", "--require-approval")
    assert again.exit_code == 2, again.output
    refusals.append((again.output, again.stderr))
    # An approval that expired.
    assert (
        ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", "1s").exit_code
        == 0
    )
    real_now = clock.now
    with monkeypatch.context() as later:
        later.setattr(clock, "now", lambda: real_now() + timedelta(seconds=2))
        assert "expired" in refused("resume")
    renewed = ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", "1h")
    assert renewed.exit_code == 0, renewed.output
    # Intents changed after the approval, then before any approval of a second run.
    tamper(ws, run_id, 2)
    assert "changed after" in refused("resume", run_id)
    other = plan(ws, "c.csv", make_rows(3, start=10))
    other_fp = stored_fingerprint(ws, other)
    tamper(ws, other, 1)
    assert "changed after planning" in refused("approve", other, "--fingerprint", other_fp)
    assert "changed after planning" in refused("approve", "--fingerprint", other_fp)
    assert "changed after planning" in refused("preview", other)
    assert "changed after planning" in refused("preview", other, "--json")
    shown = json.loads(ws.invoke("preview", other, "--json").stdout)  # whole, without one
    assert shown["count"] == 3 and shown["fingerprint"] is None
    fingerprints = {fingerprint, other_fp, current_fingerprint(ws, run_id)}
    fingerprints.add(current_fingerprint(ws, other))
    for output, refusal in refusals:
        assert FULL_FINGERPRINT.search(refusal) is None, refusal
        assert not [f for f in fingerprints if f in output], output
    assert ws.outbox_documents() == []


def test_preview_writes_every_notification_and_ends_with_its_fingerprint(ws: Workspace) -> None:
    """JSON Lines and CSV hold every notification (to, channel, subject, body, deadline,
    digest), the CSV formula-safe; the table shows the first rows on screen, all of them in
    a file; each ends with the run's
    fingerprint, which approves it."""
    rows = make_rows(25)
    rows[4][2] = '=HYPERLINK("http://evil.example")'  # u4's subject
    rows[6][3] = "-2+3"  # u6's body
    run_id = plan(ws, "b.csv", rows)
    fingerprint = str(ws.ledger.run().fingerprint)
    jsonl = ws.invoke("preview", run_id, "--format", "jsonl")
    assert jsonl.exit_code == 0, jsonl.output
    records = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [r["id"] for r in records] == [f"u{n}" for n in range(1, 26)]
    stored = {i.item_id: i.intent_digest for i in ws.ledger.items()}
    assert all(r["digest"] == stored[r["id"]] for r in records)
    assert records[24]["to"] == "user25@example.com" and records[24]["body"] == "Body of 25"
    assert {"channel", "subject", "deadline"} <= set(records[0])
    assert jsonl.stderr.splitlines()[-1] == f"fingerprint: {fingerprint}"

    out = ws.path / "review.csv"
    written = ws.invoke("preview", run_id, "--format", "csv", "--output", str(out))
    assert written.exit_code == 0, written.output
    assert written.stdout.splitlines()[-1] == f"fingerprint: {fingerprint}"
    table = list(csv.DictReader(io.StringIO(out.read_text("utf-8"))))
    assert len(table) == 25 and table[24]["id"] == "u25"
    assert table[3]["subject"] == '\'=HYPERLINK("http://evil.example")'
    assert table[5]["body"] == "'-2+3"

    shown = ws.invoke("preview", run_id)
    assert shown.exit_code == 0, shown.output
    assert "#10 u10" in shown.stdout and "#11 u11" not in shown.stdout
    assert "25 notifications, 10 shown" in shown.stdout
    assert shown.stdout.splitlines()[-1] == f"fingerprint: {fingerprint}"
    text = ws.path / "review.txt"
    filed = ws.invoke("preview", run_id, "--output", str(text))  # a file holds every one
    assert filed.exit_code == 0, filed.output
    assert "#25 u25" in text.read_text("utf-8")
    assert "25 notifications, 25 shown." in text.read_text("utf-8")
    approved = ws.invoke("approve", "--fingerprint", fingerprint)
    assert approved.exit_code == 0, approved.output


def test_reject_closes_an_awaiting_run_with_its_audit(ws: Workspace) -> None:
    """`reject --reason` closes an awaiting run (exit 0, nothing sent) and records who
    rejected it, when and why; a run not awaiting approval is not rejected (exit 2)."""
    run_id = plan(ws, "b.csv", make_rows(3))
    result = ws.invoke("reject", run_id, "--reason", "wrong audience", env={"USER": "carol"})
    assert result.exit_code == 0, result.output
    assert f"run {run_id} rejected by carol" in result.output
    run = ws.ledger.run()
    assert (run.state, run.stop_reason) == ("cancelled", "rejected by carol: wrong audience")
    (rejected,) = ws.ledger.events("rejected")
    detail = json.loads(str(rejected.detail))
    assert (detail["operator"], detail["reason"]) == ("carol", "wrong audience")
    assert clock.parse(detail["at"]) <= clock.now()
    assert ws.invoke("approve", run_id, "--fingerprint", "sha256:x").exit_code == 2
    assert ws.invoke("resume", run_id).exit_code == 2
    assert ws.outbox_documents() == []
    again = ws.invoke("reject", run_id, "--reason", "twice")
    assert again.exit_code == 2, again.output
    assert len(ws.ledger.events("rejected")) == 1


def test_expires_in_is_capped_at_30_days(ws: Workspace) -> None:
    """`--expires-in` beyond 30 days is a usage error (exit 2) that approves nothing, however
    many more days than a date holds; 30d is accepted."""
    run_id = plan(ws, "b.csv", make_rows(2))
    fingerprint = stored_fingerprint(ws, run_id)
    for span in ("31d", "30d1s", "100000d", "99999999999999999999d", "1h" + "9" * 30 + "s"):
        result = ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", span)
        assert result.exit_code == 2, result.output
        assert "30 days" in result.output
    run = ws.ledger.run()
    assert (run.state, run.approval) == ("awaiting_approval", None)
    ok = ws.invoke("approve", run_id, "--fingerprint", fingerprint, "--expires-in", "30d")
    assert ok.exit_code == 0, ok.output


def test_the_operator_is_the_login_name_when_user_is_unset(ws: Workspace) -> None:
    """Without $USER (cron, containers) the approval and the rejection record the login name
    of the process's uid, never "unknown"."""
    login = pwd.getpwuid(os.getuid()).pw_name
    no_user = {"USER": None, "USERNAME": None, "LOGNAME": None}
    run_id = plan(ws, "b.csv", make_rows(2))
    fingerprint = stored_fingerprint(ws, run_id)
    approved = ws.invoke("approve", run_id, "--fingerprint", fingerprint, env=no_user)
    assert approved.exit_code == 0, approved.output
    assert (ws.ledger.approval() or {})["operator"] == login
    other = plan(ws, "c.csv", make_rows(2, start=5))
    rejected = ws.invoke("reject", other, "--reason", "not now", env=no_user)
    assert rejected.exit_code == 0, rejected.output
    (event,) = ws.ledger.events("rejected")
    assert json.loads(str(event.detail))["operator"] == login
