"""SMTP end to end: a channel that can neither dedupe nor be asked. A crash after item 20
left makes it `unknown` — never re-sent — and an operator settles it with evidence."""

from __future__ import annotations

import json
from typing import Any

from ..conftest import Inbox, Workspace, make_rows
from ..support.crashed import crash_send


def report(ws: Workspace, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ws.invoke("report", "--format", "json", *args).output)
    return data


def test_smtp_crash_after_send_unknown_then_cancel_report_then_manual_reconcile(
    ws: Workspace, inbox: Inbox
) -> None:
    """100 mails, crash right after item 20 was handed over: resume marks it unknown (one copy
    in the mailbox), sends 21-100, exits 3; cancel reports 99 sent / 1 unknown / 0 pending;
    a manual decision with evidence settles it, and the report shows the evidence."""
    ws.write_csv("batch.csv", make_rows(100))
    crash_send("after-send:20", db=ws.db, channel="mail")
    assert len(inbox.messages) == 20
    key20 = ws.ledger.item("u20").idempotency_key

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 3, resumed.output
    line = next(x for x in resumed.stdout.splitlines() if "item 20 " in x)
    assert "unknown" in line and "NOT sent again" in line
    assert len(inbox.messages) == 100
    ids = inbox.message_ids()
    assert len(set(ids)) == 100
    assert ids.count(f"<{key20}@example.com>") == 1
    assert all(m["X-Notifier-Key"] for m in inbox.messages)

    cancelled = ws.invoke("cancel", "--report", "--format", "json")
    assert cancelled.exit_code == 3, cancelled.output  # an unknown item still needs attention
    data = json.loads(cancelled.stdout)
    assert data["state"] == "cancelled"
    counts = data["counts"]
    assert (counts["sent"], counts["unknown"], counts["pending"]) == (99, 1, 0)
    [unknown] = [i for i in data["items"] if i["state"] == "unknown"]
    assert (unknown["seq"], unknown["id"], unknown["idempotency_key"]) == (20, "u20", key20)

    decided = ws.invoke("reconcile", "--manual", "--item", "u20", "--mark", "sent",
                        "--evidence", "found in provider log")  # fmt: skip
    assert decided.exit_code == 0, decided.output
    final = report(ws)
    assert final["counts"]["sent"] == 100 and final["counts"]["unknown"] == 0
    item20 = next(i for i in final["items"] if i["seq"] == 20)
    assert (item20["receipt_source"], item20["evidence"]) == ("manual", "found in provider log")
    [decision] = final["decisions"]
    assert decision["decision"] == "mark_sent" and decision["evidence"] == "found in provider log"
    assert decision["operator"]
    table = ws.invoke("report").output
    assert "found in provider log" in table
    assert len(inbox.messages) == 100  # settling by hand sends nothing


def test_smtp_without_crash_sends_every_mail_once(ws: Workspace, inbox: Inbox) -> None:
    """The plain path: every row is one message with its own deterministic Message-ID."""
    ws.write_csv("batch.csv", make_rows(25))
    result = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    keys = set(ws.ledger.keys())
    assert sorted(inbox.message_ids()) == sorted(f"<{k}@example.com>" for k in keys)
