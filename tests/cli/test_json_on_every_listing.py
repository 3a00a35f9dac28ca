"""`--json` on every command that lists or reports (status, runs, report, cancel, reconcile,
suppress list, preview): one JSON document on stdout holding what the table shows, anything
said along the way on stderr; where `--format` is offered too, `--json` is `--format json`,
and the two disagreeing is exit 2."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import Result

from ..conftest import Inbox, Workspace, make_rows
from ..support.crashed import crash_send

pytestmark = pytest.mark.both_stores

COUNTS = {"total", "sent", "unknown", "pending", "failed", "in_flight", "expired", "suppressed"}
ITEM = {"seq", "id", "to", "state", "attempts", "idempotency_key", "receipt_id", "last_error"}


def document(result: Result, exit_code: int = 0) -> dict[str, Any]:
    """The one JSON document a command printed on stdout."""
    assert result.exit_code == exit_code, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture
def runs(ws: Workspace) -> tuple[str, str]:
    """A run sent to the outbox, then one awaiting approval, and one suppressed address."""
    sent = ws.invoke("send", str(ws.write_csv("a.csv", make_rows(3))), "--run-id", "r-sent")
    assert sent.exit_code == 0, sent.output
    waiting = ws.write_csv("b.csv", make_rows(2, start=4))
    held = ws.invoke("send", str(waiting), "--run-id", "r-held", "--require-approval")
    assert held.exit_code == 0, held.output
    added = ws.invoke("suppress", "add", "gone@example.com", "--reason", "bounced")
    assert added.exit_code == 0, added.output
    return "r-sent", "r-held"


def test_status_and_report_print_the_report_object(ws: Workspace, runs: tuple[str, str]) -> None:
    """status --json, report --json and report --format json: the same report object, with
    the run, its state, fingerprint, counts, pending detail and every item's fields."""
    status = document(ws.invoke("status", runs[0], "--json"))
    report = document(ws.invoke("report", runs[0], "--json"))
    assert report == document(ws.invoke("report", runs[0], "--format", "json"))
    assert status == report
    assert report["run_id"] == runs[0] and report["state"] == "completed"
    assert report["fingerprint"].startswith("sha256:")
    assert set(report["counts"]) == COUNTS and report["counts"]["sent"] == 3
    assert set(report["pending_detail"]) == {"never_attempted", "retry_waiting", "maybe_delivered"}
    assert {"stop_reason", "drafts", "workers", "waiting", "decisions"} <= set(report)
    assert [i["id"] for i in report["items"]] == ["u1", "u2", "u3"]
    assert all(set(i) >= ITEM and i["receipt_id"] for i in report["items"])
    only = document(ws.invoke("report", runs[0], "--state", "failed", "--json"))
    assert only["items"] == [] and only["state_filter"] == ["failed"]


def test_runs_lists_every_run_with_the_tables_columns(ws: Workspace, runs: tuple[str, str]) -> None:
    listed = document(ws.invoke("runs", "--json"))["runs"]
    assert [r["run_id"] for r in listed] == [runs[1], runs[0]]  # newest first
    assert [r["state"] for r in listed] == ["awaiting_approval", "completed"]
    for run in listed:
        assert {"created_at", "channels", "counts", "batch", "approval_expired_at"} <= set(run)
        assert run["channels"] == ["outbox"]
        assert set(run["counts"]) == COUNTS


def test_the_counts_runs_shows_add_up_to_every_item_expired_ones_too(ws: Workspace) -> None:
    """Items never sent because their deadline passed need attention (exit 3): `runs`
    counts them, in `--json` and in the table, so its counts add up to the run's total."""
    ws.write_csv("batch.csv", make_rows(2))
    sent = ws.invoke("send", "batch.csv", "--not-after", "2001-01-01T00:00:00Z", "--allow-expired")
    assert sent.exit_code == 3, sent.output
    assert set(ws.ledger.states().values()) == {"expired"}
    counts = document(ws.invoke("runs", "--json"))["runs"][0]["counts"]
    assert counts["expired"] == 2
    assert sum(n for name, n in counts.items() if name != "total") == counts["total"] == 2
    table = ws.invoke("runs").output
    assert "expired" in table, table


def test_preview_prints_every_notification_and_the_fingerprint(
    ws: Workspace, runs: tuple[str, str]
) -> None:
    """One document: every notification with the fields of the table, how many, and the
    fingerprint the table's last line gives (which goes to stderr, as after jsonl)."""
    table = ws.invoke("preview", runs[1])
    assert table.exit_code == 0, table.output
    fingerprint = table.stdout.strip().splitlines()[-1].removeprefix("fingerprint: ")
    result = ws.invoke("preview", runs[1], "--json")
    preview = document(result)
    assert preview["run_id"] == runs[1] and preview["count"] == 2
    assert preview["fingerprint"] == fingerprint
    assert [n["id"] for n in preview["notifications"]] == ["u4", "u5"]
    fields = {"seq", "id", "to", "channel", "subject", "body", "deadline", "digest", "data"}
    assert all(set(n) == fields for n in preview["notifications"])
    assert preview["notifications"][0]["subject"] == "Hello 4"
    assert result.stderr.strip() == f"fingerprint: {fingerprint}"
    assert document(ws.invoke("preview", runs[1], "--format", "json")) == preview


def test_suppress_list(ws: Workspace, runs: tuple[str, str]) -> None:
    listed = document(ws.invoke("suppress", "list", "--json"))["suppressions"]
    assert [(s["address"], s["reason"], s["source"]) for s in listed] == [
        ("gone@example.com", "bounced", "operator")
    ]
    assert {"operator", "created_at"} <= set(listed[0])
    assert listed == document(ws.invoke("suppress", "list", "--format", "json"))["suppressions"]


def test_reconcile_prints_the_run_its_state_and_counts(
    ws: Workspace, runs: tuple[str, str]
) -> None:
    """The result the text gives as `run ID: STATE`, with the counts; what it did on stderr."""
    result = ws.invoke("reconcile", runs[0], "--json")
    assert document(result) == {
        "run_id": runs[0],
        "state": "completed",
        "counts": {**dict.fromkeys(COUNTS, 0), "total": 3, "sent": 3},
    }
    assert "nothing to settle" in result.stderr
    prompts = ws.invoke("reconcile", runs[0], "--manual", "--json")
    assert prompts.exit_code == 2 and prompts.stdout == ""
    assert "--item ID --mark" in prompts.stderr


def test_a_manual_decision_prints_the_run_its_state_and_counts(ws: Workspace, inbox: Inbox) -> None:
    """reconcile --manual --item … --json: the decision said on stderr, the result on stdout."""
    ws.write_csv("batch.csv", make_rows(2))
    crash_send("after-send:1", db=ws.db, channel="mail")
    assert ws.invoke("resume").exit_code == 3  # SMTP cannot be asked: u1 is unknown
    result = ws.invoke("reconcile", "--manual", "--item", "u1", "--mark", "sent",
                       "--evidence", "in the relay's log", "--json")  # fmt: skip
    done = document(result)
    assert done["state"] == "completed" and done["counts"]["sent"] == 2
    assert "u1" in result.stderr


def test_cancel_json_is_its_report(ws: Workspace, runs: tuple[str, str]) -> None:
    """cancel --json prints the report of the run it cancelled (as --report --format json);
    the line saying what was cancelled goes to stderr. Exit 3: two items never sent."""
    result = ws.invoke("cancel", runs[1], "--json")
    report = document(result, exit_code=3)
    assert report["run_id"] == runs[1] and report["state"] == "cancelled"
    assert report["counts"]["pending"] == 2 and len(report["items"]) == 2
    assert runs[1] in result.stderr and "cancelled" in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("report", "--format", "csv"),
        ("cancel", "--format", "table"),
        ("preview", "--format", "jsonl"),
        ("suppress", "list", "--format", "csv"),
    ],
    ids=lambda c: "-".join(c[:-2]),
)
def test_json_and_another_format_disagree_exit_2_doing_nothing(
    ws: Workspace, runs: tuple[str, str], command: tuple[str, ...]
) -> None:
    """--json with a --format other than json: exit 2 naming both and the commands that
    work; nothing on stdout, and nothing cancelled."""
    result = ws.invoke(*command, "--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert f"--json and {' '.join(command[-2:])} disagree" in result.stderr
    assert f"`notifier {' '.join(command[:-2])} --json`" in result.stderr
    assert document(ws.invoke("status", runs[1], "--json"))["state"] == "awaiting_approval"
