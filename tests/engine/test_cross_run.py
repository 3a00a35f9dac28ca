"""A row's identity across runs in one database: `send` plans only what earlier
runs did not deliver, refuses a row another unfinished run holds or whose delivered content
changed, and retries what was never delivered. Through the real CLI, on both stores."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send
from ..support.waits import past_every_window

pytestmark = pytest.mark.both_stores
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _keys(ws: Workspace) -> list[str]:
    return sorted(d["idempotency_key"] for d in ws.outbox_documents())


def _written(ws: Workspace) -> list[str]:
    """The item id of every file in the outbox, sorted (duplicates kept)."""
    return sorted(d["item_id"] for d in ws.outbox_documents())


def _runs(ws: Workspace) -> list[str]:
    return [run.run_id for run in ws.ledger.runs()]


def test_an_appended_row_is_the_only_one_sent(ws: Workspace) -> None:
    """5 rows sent, a 6th appended: the same send plans and sends only the 6th."""
    ws.write_csv("b.csv", make_rows(5))
    assert ws.invoke("send", "b.csv").exit_code == 0
    [first] = _runs(ws)
    ws.write_csv("b.csv", make_rows(6))
    again = ws.invoke("send", "b.csv")
    assert again.exit_code == 0, again.output
    assert f"5 row(s) already delivered with the same content by run {first}" in again.output
    assert "1 notification (" in again.output
    assert _written(ws) == [f"u{i}" for i in range(1, 7)]
    assert len(ws.outbox_documents()) == 6


def test_a_changed_row_is_refused_until_resend_changed(ws: Workspace) -> None:
    """A delivered row whose subject changed refuses the file (exit 2) naming it and
    nothing is stored; --resend-changed sends only it, under a new key."""
    rows = make_rows(4)
    ws.write_csv("b.csv", rows)
    assert ws.invoke("send", "b.csv").exit_code == 0
    [first] = _runs(ws)
    before = _keys(ws)
    rows[2][2] = "Hello 2, corrected"
    ws.write_csv("b.csv", rows)
    refused = ws.invoke("send", "b.csv")
    assert refused.exit_code == 2, refused.output
    assert "u2 (row 2)" in refused.output and first in refused.output
    assert "--resend-changed" in refused.output
    assert _runs(ws) == [first]
    resent = ws.invoke("send", "b.csv", "--resend-changed")
    assert resent.exit_code == 0, resent.output
    assert _written(ws) == ["u1", "u2", "u2", "u3", "u4"]
    [new_key] = set(_keys(ws)) - set(before)
    [item] = [i for i in ws.ledger.items() if i.run_id != first]
    payload = ws.ledger.payload(item.seq, item.run_id)
    assert item.idempotency_key == new_key and "corrected" in payload["subject"]


def test_a_failed_item_is_retried_by_sending_the_same_file_again(ws: Workspace) -> None:
    """u3 fails (400): the run ends exit 3 advising to send the same file again; once the
    cause is fixed, that send plans only u3, in a new run, naming the earlier one."""
    broken = {"on": True}
    receiver = Receiver(answer=lambda item_id, n: 400 if item_id == "u3" and broken["on"] else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("b.csv", make_rows(5))
        failed = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert failed.exit_code == 3, failed.output
        assert "send the same file again" in failed.output
        assert "notifier send b.csv" in failed.output
        [first] = _runs(ws)
        broken["on"] = False
        retried = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert retried.exit_code == 0, retried.output
    assert f"1 row(s) never delivered by earlier run {first}" in retried.output
    assert "1 notification (" in retried.output
    assert sorted(receiver.commits) == sorted(ws.ledger.keys("sent"))
    assert [a.item_id for a in receiver.arrivals].count("u1") == 1
    assert [i.item_id for i in ws.ledger.items() if i.run_id != first] == ["u3"]


def test_a_cancelled_run_is_finished_by_sending_the_same_file(ws: Workspace) -> None:
    """A run cancelled after 3 of 8 (its process killed, then `cancel`): the same send
    plans and sends only the 5 never attempted; each row written once."""
    ws.write_csv("b.csv", make_rows(8))
    crash_send("after-receipt:3", "b.csv", db=ws.db)
    assert ws.invoke("cancel").exit_code in (0, 3)
    [first] = _runs(ws)
    assert ws.ledger.run().state == "cancelled"
    again = ws.invoke("send", "b.csv")
    assert again.exit_code == 0, again.output
    assert f"3 row(s) already delivered with the same content by run {first}" in again.output
    assert f"5 row(s) never delivered by earlier run {first}" in again.output
    assert _written(ws) == [f"u{i}" for i in range(1, 9)]


def test_a_row_open_in_an_unfinished_run_refuses_the_file(ws: Workspace) -> None:
    """A run left unfinished by a crash holds its rows: sending the file again (even with a
    row appended) exits 2 naming that run and `notifier resume`, and stores nothing."""
    ws.write_csv("b.csv", make_rows(6))
    crash_send("after-receipt:2", "b.csv", db=ws.db)
    [first] = _runs(ws)
    ws.write_csv("b.csv", make_rows(7))
    refused = ws.invoke("send", "b.csv")
    assert refused.exit_code == 2, refused.output
    assert "4 row(s) are still open" in refused.output
    assert f"notifier resume {first}" in refused.output
    assert _runs(ws) == [first]
    assert len(ws.outbox_documents()) == 2


def test_without_an_id_column_a_row_inserted_at_the_top_sends_only_it(ws: Workspace) -> None:
    """No id column: identity is recipient and content, not the line, so a row inserted
    above the others is the only one sent."""
    rows = [["to", "subject", "body"]] + [
        [f"user{i}@example.com", "Hi", f"B{i}"] for i in (1, 2, 3)
    ]
    ws.write_csv("b.csv", rows)
    assert ws.invoke("send", "b.csv").exit_code == 0
    rows.insert(1, ["new@example.com", "Hi", "B0"])
    ws.write_csv("b.csv", rows)
    again = ws.invoke("send", "b.csv")
    assert again.exit_code == 0, again.output
    assert "3 row(s) already delivered" in again.output
    targets = sorted(d["to"] for d in ws.outbox_documents())
    assert targets == ["new@example.com", *(f"user{i}@example.com" for i in (1, 2, 3))]


def test_a_file_with_nothing_left_to_send_plans_nothing(ws: Workspace) -> None:
    """The same file after its run completed: exit 0, "nothing to send", no new run."""
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv").exit_code == 0
    again = ws.invoke("send", "b.csv")
    assert again.exit_code == 0, again.output
    assert "nothing to send" in again.output
    assert len(_runs(ws)) == 1 and len(ws.outbox_documents()) == 3


def test_new_run_sends_every_row_again(ws: Workspace) -> None:
    """Where the same send has nothing left, --new-run skips the comparison: every row
    again, under new keys."""
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv").exit_code == 0
    assert "nothing to send" in ws.invoke("send", "b.csv").output
    again = ws.invoke("send", "b.csv", "--new-run")
    assert again.exit_code == 0, again.output
    assert len(_runs(ws)) == 2
    assert len(set(_keys(ws))) == 6


def test_a_database_from_before_m006_resumes_and_its_deliveries_count(ws: Workspace) -> None:
    """A database written before m006 (a completed run with ids, a run without ids left in
    flight): `resume` migrates and finishes it, each file once; afterwards both files have
    nothing left to send, and a row appended to the first is the only one sent."""
    if ws.url:
        with psycopg.connect(ws.url, autocommit=True) as conn:
            sql = (FIXTURES / "m006-delivered-and-inflight-pg.sql").read_text()
            conn.execute(sql.encode())
        shutil.copytree(FIXTURES / "m006-delivered-and-inflight-pg.outbox", ws.outbox)
    else:
        shutil.copy(FIXTURES / "m006-delivered-and-inflight.db", ws.db_file)
        shutil.copytree(FIXTURES / "m006-delivered-and-inflight.outbox", ws.outbox)
    shutil.copy(FIXTURES / "m006-delivered-and-inflight.csv", ws.path / "batch.csv")
    shutil.copy(FIXTURES / "m006-delivered-and-inflight-done.csv", ws.path / "done.csv")
    resumed = ws.invoke("resume", "m006-fixture")
    assert resumed.exit_code == 0, resumed.output
    assert len(ws.outbox_documents()) == 13
    assert len(set(_keys(ws))) == 13
    for batch in ("batch.csv", "done.csv"):
        again = ws.invoke("send", batch)
        assert again.exit_code == 0, again.output
        assert "nothing to send" in again.output
    with (ws.path / "done.csv").open("a", encoding="utf-8") as handle:
        handle.write("c6,customer6@example.com,Welcome 6,Hello customer 6\r\n")
    appended = ws.invoke("send", "done.csv")
    assert appended.exit_code == 0, appended.output
    assert "5 row(s) already delivered with the same content by run m006-done" in appended.output
    assert len(ws.outbox_documents()) == 14


def test_an_early_404_on_a_channel_that_dedupes_never_ends_an_item_as_undelivered(
    ws: Workspace,
) -> None:
    """An idempotent webhook whose receiver commits 1.5 s after a request arrives (timeout
    1, query_delay 2, one attempt): the 404 its status query gives at once is not proof, so
    the item is not failed but asked about again, found and recorded sent; sending the file
    again sends nothing more (no second delivery under a new key)."""
    receiver = Receiver(commit_delay_s=1.5)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(
                receiver,
                idempotent=True,
                status=True,
                timeout=1,
                query_delay=2,
                retry="[retry]\nmax_attempts = 1\n",
            )
        )
        ws.write_csv("b.csv", make_rows(1))
        first = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert first.exit_code == 0, first.output
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 0, again.output
        receiver.wait_for(lambda r: len(r.commits) == len(r.arrivals))
    assert len(receiver.commits) == 1, receiver.commits


def test_an_abandoned_item_is_never_sent_again_until_marked_not_sent(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item whose outcome nobody knows (a 504 from a receiver that did commit it, on a
    channel that can neither dedupe nor be asked) and that an operator abandons is failed
    but maybe delivered: sending the file again leaves its row out, naming the run and the
    mark that would release it, so the recipient gets no second copy; once the operator marks
    it not-sent (refused until the receiver's window has passed), the next send plans it
    again."""
    receiver = Receiver(answer=lambda item_id, n: 504 if (item_id, n) == ("u2", 1) else None)
    receiver.commit_first = True  # the gateway's 504 hides a delivery
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        ws.write_csv("b.csv", make_rows(3))
        first = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert first.exit_code == 3, first.output
        (run_id,) = _runs(ws)
        assert ws.ledger.states() == {"u1": "sent", "u2": "unknown", "u3": "sent"}
        abandoned = ws.invoke("reconcile", run_id, "--manual", "--item", "u2",
                              "--mark", "abandon", "--evidence", "customer called")  # fmt: skip
        assert abandoned.exit_code == 3, abandoned.output
        assert "maybe delivered" in abandoned.output
        report = ws.invoke("report", run_id, "--format", "json").output
        assert "abandoned by" in report and "maybe delivered: customer called" in report
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 0, again.output
        assert "abandoned by an operator" in again.output and run_id in again.output
        assert f"notifier reconcile {run_id} --manual --item ID --mark not-sent" in again.output
        assert _runs(ws) == [run_id]  # nothing planned
        assert receiver.posts("u2") == 1
        release = ("reconcile", run_id, "--manual", "--item", "u2", "--mark", "not-sent",
                   "--evidence", "bounce came back")  # fmt: skip
        too_early = ws.invoke(*release)
        assert too_early.exit_code == 4, too_early.output
        assert "may still commit" in too_early.output
        past_every_window(monkeypatch)
        released = ws.invoke(*release)
        assert released.exit_code in (0, 3), released.output
        resent = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert resent.exit_code == 0, resent.output
    assert receiver.posts("u2") == 2  # sent again only on the operator's word
    assert [receiver.posts(i) for i in ("u1", "u3")] == [1, 1]


def test_sending_again_rows_left_only_for_suppressed_recipients_stores_no_run(
    ws: Workspace,
) -> None:
    """A file sent again whose only rows left go to suppressed recipients (suppressed last
    time too) stores no run of nothing but suppressed items: exit 0, saying so, each time."""
    assert ws.invoke("suppress", "add", "user2@example.com").exit_code == 0
    ws.write_csv("b.csv", make_rows(2))
    first = ws.invoke("send", "b.csv")
    assert first.exit_code == 0, first.output
    for _ in range(2):
        again = ws.invoke("send", "b.csv")
        assert again.exit_code == 0, again.output
        assert "all go to suppressed recipients" in again.output
    assert len(_runs(ws)) == 1
    assert _written(ws) == ["u1"]
