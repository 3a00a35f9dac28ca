"""Reconcile (by query and by hand) and the report formats (docs/design.md section 11); a
run's "stopped because" follows the manual decisions and is gone once no item is unknown."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import pytest

from notifier.domain.cells import safe_cell
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Inbox, Workspace, make_rows
from ..support.crashed import crash_resume, crash_send
from ..support.waits import past_every_window

pytestmark = pytest.mark.both_stores


@pytest.fixture
def hooks(ws: Workspace) -> Iterator[Sandbox]:
    with Sandbox(faults=Faults(latency_ms=20)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            f'status_url = "{sandbox.url}/notifications/{{key}}"\n'
        )
        yield sandbox


def test_reconcile_settles_in_flight_items_by_query(ws: Workspace, hooks: Sandbox) -> None:
    """After a crash, `reconcile` asks the downstream about the in-flight item and records
    what it finds, without sending anything."""
    ws.write_csv("batch.csv", make_rows(10))
    crash_send("after-send:7", db=ws.db, channel="hooks")
    assert ws.ledger.item("u7").state == "in_flight"
    requests = hooks.stats()["totals"]["requests"]
    result = ws.invoke("reconcile")
    assert result.exit_code == 0, result.output
    assert "item 7 (u7)" in result.output and "receipt found" in result.output
    assert hooks.stats()["totals"]["requests"] == requests
    states = {i.seq: i.state for i in ws.ledger.items()}
    assert states[7] == "sent" and states[8] == "pending"
    assert ws.ledger.receipt_sources()[ws.ledger.item("u7").idempotency_key] == "query"
    again = ws.invoke("reconcile")  # running it twice is harmless
    assert again.exit_code == 0 and "nothing to settle" in again.output


def test_manual_reconcile_interactively(
    ws: Workspace, inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator is shown each unknown item and decides: sent (with evidence) or not sent
    (back to pending, resent under the same key by resume), once the relay's timeout has
    passed (tests/engine/test_a_not_sent_mark_waits_out_the_receivers_window.py)."""
    ws.write_csv("batch.csv", make_rows(8))
    crash_send("after-send:3", db=ws.db, channel="mail")
    crash_resume("after-intent:6", db=ws.db)
    assert ws.invoke("resume").exit_code == 3
    assert [i.seq for i in ws.ledger.items() if i.state == "unknown"] == [3, 6]
    key6 = ws.ledger.item("u6").idempotency_key
    past_every_window(monkeypatch)

    session = ws.invoke("reconcile", "--manual", input="s\n\nseen in the mail log\nn\nnot in log\n")
    assert session.exit_code == 0, session.output
    assert "item u3 (seq 3)" in session.output and key6 in session.output
    assert "evidence (required)" in session.output
    states = {i.seq: i.state for i in ws.ledger.items()}
    assert (states[3], states[6]) == ("sent", "pending")
    decisions = ws.ledger.decisions()
    assert decisions == [(3, "mark_sent", "seen in the mail log"),
                         (6, "mark_not_sent", "not in log")]  # fmt: skip

    sent_before = len(inbox.messages)
    assert ws.invoke("resume").exit_code == 0
    assert len(inbox.messages) == sent_before + 1
    assert str(inbox.messages[-1]["X-Notifier-Key"]) == key6
    assert ws.status()["state"] == "completed"


def test_manual_reconcile_refuses_what_it_cannot_decide(ws: Workspace, inbox: Inbox) -> None:
    """Only unknown items are settled by hand, always with evidence; bad references exit 2."""
    ws.write_csv("batch.csv", make_rows(4))
    crash_send("after-send:2", db=ws.db, channel="mail")
    assert ws.invoke("resume").exit_code == 3
    sent_item = ws.invoke("reconcile", "--manual", "--item", "u1", "--mark", "sent",
                          "--evidence", "x")  # fmt: skip
    assert sent_item.exit_code == 2 and "is sent, not unknown" in sent_item.output
    no_such = ws.invoke("reconcile", "--manual", "--item", "zz", "--mark", "sent",
                        "--evidence", "x")  # fmt: skip
    assert no_such.exit_code == 2 and "no item 'zz'" in no_such.output
    missing = ws.invoke("reconcile", "--manual", "--item", "u2", "--mark", "sent")
    assert missing.exit_code == 2 and "--evidence" in missing.output
    blank = ws.invoke("reconcile", "--manual", "--item", "u2", "--mark", "sent",
                      "--evidence", "  ")  # fmt: skip
    assert blank.exit_code == 2
    assert ws.ledger.decisions() == []
    abandoned = ws.invoke("reconcile", "--manual", "--item", "u2", "--mark", "abandon",
                          "--evidence", "customer asked us to stop")  # fmt: skip
    assert abandoned.exit_code == 3  # a failed item still needs attention
    assert ws.status()["state"] == "completed"


def test_a_manual_mark_names_its_item_by_id_never_by_position(ws: Workspace, inbox: Inbox) -> None:
    """`--item` takes the row's id, as the report lists it: a number that is no id of the
    run (an id from another run, a typo) is refused, exit 2, nothing marked, and never
    taken for the item at that position, which is another recipient (marked not-sent, it
    would be sent again)."""
    ws.write_csv("batch.csv", make_rows(4))
    crash_send("after-send:2", db=ws.db, channel="mail")
    assert ws.invoke("resume").exit_code == 3
    assert ws.ledger.item("u2").state == "unknown" and ws.ledger.item("u2").seq == 2
    by_position = ws.invoke("reconcile", "--manual", "--item", "2", "--mark", "sent",
                            "--evidence", "the relay's log")  # fmt: skip
    assert by_position.exit_code == 2, by_position.output
    assert "no item '2'" in by_position.output
    assert "notifier report" in by_position.output  # where the ids are listed
    assert ws.ledger.decisions() == []
    assert ws.ledger.item("u2").state == "unknown"


def test_csv_report_neutralises_spreadsheet_formulas(ws: Workspace) -> None:
    """Cells that a spreadsheet would run (=, +, -, @, tab, CR first) are exported as text."""
    ws.write_csv(
        "batch.csv",
        [["id", "to", "subject"],
         ["=HYPERLINK(\"http://evil.test\")", "+15551234567", "a"],
         ["@SUM(A1)", "-2", "b"],
         ["plain", "ada@example.com", "c"]],
    )  # fmt: skip
    assert ws.invoke("send", "batch.csv").exit_code == 0
    exported = ws.invoke("report", "--format", "csv").output
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [r["id"] for r in rows] == ['\'=HYPERLINK("http://evil.test")', "'@SUM(A1)", "plain"]
    assert [r["to"] for r in rows] == ["'+15551234567", "'-2", "ada@example.com"]
    assert all(r["state"] == "sent" for r in rows)
    for value in ("\tx", "\rx"):
        assert safe_cell(value) == "'" + value


def test_the_status_table_shows_counts_then_only_items_needing_attention(
    ws: Workspace,
) -> None:
    """The table starts with the counts and lists unknown/failed items, not the sent ones."""
    with Sandbox(faults=Faults(force_status={"u2": 400})) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
        )
        ws.write_csv("batch.csv", make_rows(3))
        assert ws.invoke("send", "batch.csv", "--channel", "hooks").exit_code == 3
    table = ws.invoke("status").output
    assert table.index("total") < table.index("items needing attention")
    attention = table[table.index("items needing attention") :]
    assert "u2" in attention and "HTTP 400" in attention
    assert "u1" not in attention and "u3" not in attention
    data = json.loads(ws.invoke("status", "--json").output)
    assert data["counts"]["failed"] == 1


def test_report_lists_every_item_where_status_shows_only_those_needing_attention(
    ws: Workspace,
) -> None:
    """`report` (its table) lists every item, a line each with its state and receipt;
    `status` shows the counts and only the items needing attention."""
    ws.write_csv("b.csv", make_rows(4))
    assert ws.invoke("send", "b.csv").exit_code == 0
    status = ws.invoke("status")
    full = ws.invoke("report")
    assert status.exit_code == full.exit_code == 0
    assert full.output.startswith(status.output)  # the same head, then every item
    assert "u3" not in status.output
    lines = [
        line.split()
        for line in full.output.splitlines()
        if line.strip().startswith(("1 ", "2 ", "3 ", "4 "))
    ]
    assert [(seq, state, item_id) for seq, state, _, item_id, *_ in lines] == [
        ("1", "sent", "u1"), ("2", "sent", "u2"), ("3", "sent", "u3"), ("4", "sent", "u4")
    ]  # fmt: skip


def two_unknown_items(ws: Workspace) -> str:
    """A run on the (unqueryable) SMTP channel whose items u1 and u2 are unknown (each killed
    right after its send), u3 sent; the run paused for them. Returns the run id."""
    ws.write_csv("batch.csv", make_rows(3))
    crash_send("after-send:1", db=ws.db, channel="mail")
    crash_resume("after-send:2", db=ws.db)
    assert ws.invoke("resume").exit_code == 3
    assert [i.item_id for i in ws.ledger.items() if i.state == "unknown"] == ["u1", "u2"]
    return ws.ledger.run().run_id


def mark(ws: Workspace, item: str, decision: str) -> None:
    result = ws.invoke(
        "reconcile", "--manual", "--item", item, "--mark", decision, "--evidence", "mail log"
    )
    assert result.exit_code in (0, 3), result.output


def test_settling_unknown_items_by_hand_updates_then_clears_the_stop_reason(
    ws: Workspace, inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run paused for unknown outcomes: each manual decision brings "stopped because" up to
    date, and once no item is unknown it is gone, though the run still waits to resume."""
    two_unknown_items(ws)
    past_every_window(monkeypatch)  # a not-sent mark waits out the relay's timeout
    assert ws.status()["stop_reason"] == "2 item(s) with unknown outcome"
    mark(ws, "u1", "not-sent")
    assert ws.status()["stop_reason"] == "1 item(s) with unknown outcome"
    mark(ws, "u2", "sent")
    report = ws.status()
    assert report["state"] == "paused" and report["stop_reason"] is None
    assert "stopped because" not in ws.invoke("status").output
    assert ws.invoke("resume").exit_code == 0
    assert ws.status()["state"] == "completed"


def test_a_run_completed_by_manual_reconcile_shows_no_stop_reason(
    ws: Workspace, inbox: Inbox
) -> None:
    """A run that `reconcile --manual` completes no longer says it stopped because of
    unknown outcomes."""
    two_unknown_items(ws)
    mark(ws, "u1", "sent")
    mark(ws, "u2", "abandon")
    report = ws.status()
    assert report["state"] == "completed" and report["stop_reason"] is None
    assert "stopped because" not in ws.invoke("status").output
