"""Whatever is changed in a run after it was written is found by `verify`, and named: an
item's state, a receipt id, an attempt, an event deleted, inserted, reordered or edited, the
database cut short mid-run, a manual mark given another operator, a chain keyed with another
key, and a chain forged end to end without the key (found with the key; "unkeyed" without).
Each on both stores, against a run sent under the audit key through a scripted receiver:
u2 and u5 lost their answers (unknown), u5 then marked sent by carol."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from notifier.api import Notifier, settling
from notifier.channels.scripted import DELIVER, LOST_AFTER_COMMIT, Kind, Response
from notifier.domain.chain import KEY_ENV, UNKEYED, Signer
from notifier.domain.intent import Intent
from notifier.domain.replay import RunRows
from notifier.domain.state_machine import RunState
from notifier.domain.verify import AuditVerdict
from notifier.engine import membership
from notifier.store.audit import AuditRecords

from ..conftest import Workspace, wait_for
from ..support.audited import (
    KEY,
    TOML,
    config,
    keyed,
    named,
    rewrite_intent,
    send,
    stored_fingerprint,
    verdict,
)
from ..support.background import WAIT_S, Worker

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "audited"


def lose_2_and_5(intent: Intent, tries: int) -> Response:
    return LOST_AFTER_COMMIT if intent.seq in (2, 5) else DELIVER


@pytest.fixture
def run(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """The run, verified whole before any test changes it."""
    keyed(monkeypatch)
    send(ws, RUN, 6, lose_2_and_5)
    (ws.path / "notifier.toml").write_text(TOML)
    marked = ws.invoke(
        "reconcile", RUN, "--manual", "--item", "u5", "--mark", "sent",
        "--evidence", "relay log line 7", env={"USER": "carol"},
    )  # fmt: skip
    assert marked.exit_code in (0, 3), marked.output
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())
    return ws


def event_no(ws: Workspace, kind: str, item_seq: int) -> int:
    (event,) = (e for e in ws.ledger.events(kind, RUN) if e.item_seq == item_seq)
    return event.seq_no


def last_event(ws: Workspace) -> tuple[int, str]:
    ((seq_no, hashed),) = ws.query(
        "SELECT seq_no, hash FROM events WHERE run_id = ? ORDER BY seq_no DESC LIMIT 1", (RUN,)
    )
    return int(seq_no), str(hashed)


def key_of(ws: Workspace, seq: int) -> str:
    (item,) = (i for i in ws.ledger.items(RUN) if i.seq == seq)
    return item.idempotency_key


def test_an_item_state_changed_from_unknown_to_sent_is_named(run: Workspace) -> None:
    run.write("UPDATE items SET state = 'sent' WHERE run_id = ? AND seq = 2", (RUN,))
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("items", "item u2 (seq 2)", "differs", "state")}
    (difference,) = found.findings
    assert (difference.stored, difference.expected) == ("sent", "unknown")


def test_a_receipt_id_edited_is_named(run: Workspace) -> None:
    run.write("UPDATE receipts SET receipt_id = 'forged' WHERE idempotency_key = ?",
              (key_of(run, 3),))  # fmt: skip
    found = verdict(run, RUN)
    assert named(found) == {("receipts", "receipt of item u3 (seq 3)", "differs", "receipt_id")}
    assert found.findings[0].stored == "forged"


def test_an_attempt_deleted_is_named(run: Workspace) -> None:
    run.write("DELETE FROM attempts WHERE run_id = ? AND seq = 4", (RUN,))
    found = verdict(run, RUN)
    assert named(found) == {("attempts", "attempt 1 of item u4 (seq 4)", "missing", None)}


def test_an_event_deleted_is_named(run: Workspace) -> None:
    gone = event_no(run, "ack", 3)
    run.write("DELETE FROM events WHERE run_id = ? AND seq_no = ?", (RUN, gone))
    found = verdict(run, RUN)
    assert ("events", f"event {gone}", "missing", None) in named(found)
    # The next event's link names what it followed; the replay names the item it left.
    assert ("events", f"event {gone + 1}", "differs", "prev_hash") in named(found)
    assert ("items", "item u3 (seq 3)", "differs", "state") in named(found)


def test_an_event_inserted_at_the_end_is_named(run: Workspace) -> None:
    """Appended with a link that looks right to anyone without the key: its hash is
    SHA-256 over its content and the last event's hash."""
    seq_no, prev = last_event(run)
    forged = UNKEYED.link(prev, RUN, seq_no + 1, "mark_sent", 2, '{"from": "unknown"}', "t")
    run.write(
        "INSERT INTO events (run_id, seq_no, at, kind, item_seq, detail, prev_hash, hash) "
        "VALUES (?, ?, 't', 'mark_sent', 2, '{\"from\": \"unknown\"}', ?, ?)",
        (RUN, seq_no + 1, prev, forged),
    )
    found = verdict(run, RUN)
    assert ("events", f"event {seq_no + 1}", "differs", "hash") in named(found)
    assert ("items", "item u2 (seq 2)", "differs", "state") in named(found)


def test_an_event_inserted_mid_run_is_named_with_every_event_it_renumbered(
    run: Workspace,
) -> None:
    """Slipped in after u3's ack, the events after it moved up one: the new event's link
    and every renumbered one fail the key."""
    at = event_no(run, "ack", 3)
    last, _ = last_event(run)
    # Two steps, so no number is ever held twice (the primary key).
    run.write("UPDATE events SET seq_no = seq_no + 1000 WHERE run_id = ? AND seq_no > ?",
              (RUN, at))  # fmt: skip
    run.write("UPDATE events SET seq_no = seq_no - 999 WHERE run_id = ? AND seq_no > 1000",
              (RUN,))  # fmt: skip
    ((prev,),) = run.query("SELECT hash FROM events WHERE run_id = ? AND seq_no = ?", (RUN, at))
    detail = '{"from": "pending", "to": "expired"}'
    forged = UNKEYED.link(prev, RUN, at + 1, "expire", 6, detail, "t")
    run.write(
        "INSERT INTO events (run_id, seq_no, at, kind, item_seq, detail, prev_hash, hash) "
        "VALUES (?, ?, 't', 'expire', 6, ?, ?, ?)",
        (RUN, at + 1, detail, prev, forged),
    )
    hashes = {row for table, row, _, column in named(verdict(run, RUN)) if column == "hash"}
    assert hashes == {f"event {n}" for n in range(at + 1, last + 2)}


def test_two_events_reordered_are_both_named(run: Workspace) -> None:
    """Two events swap places (their content moves, their numbers stay)."""
    first, second = event_no(run, "ack", 3), event_no(run, "ack", 4)
    rows = run.query(
        "SELECT seq_no, at, kind, item_seq, detail FROM events WHERE run_id = ? AND seq_no IN "
        "(?, ?) ORDER BY seq_no",
        (RUN, first, second),
    )
    for (_, at, kind, item_seq, detail), seq_no in zip(rows, (second, first), strict=True):
        run.write(
            "UPDATE events SET at = ?, kind = ?, item_seq = ?, detail = ? "
            "WHERE run_id = ? AND seq_no = ?",
            (at, kind, item_seq, detail, RUN, seq_no),
        )
    found = verdict(run, RUN)
    assert {("events", f"event {n}", "differs", "hash") for n in (first, second)} <= named(found)


def test_an_event_detail_edited_is_named(run: Workspace) -> None:
    edited = event_no(run, "ack", 1)
    run.write(
        "UPDATE events SET detail = REPLACE(detail, '\"sent\"', '\"failed\"') "
        "WHERE run_id = ? AND seq_no = ?",
        (RUN, edited),
    )
    found = verdict(run, RUN)
    assert ("events", f"event {edited}", "differs", "hash") in named(found)


def test_a_database_cut_short_mid_run_names_each_item_it_left(run: Workspace) -> None:
    """Every event after u3's ack removed, as a restore from an old backup of the events
    alone would leave them: the chain that remains holds, and the replay names the items
    and the run whose later history is gone."""
    cut = event_no(run, "ack", 3)
    lost = {seq for (seq,) in run.query(
        "SELECT DISTINCT item_seq FROM events WHERE run_id = ? AND seq_no > ? "
        "AND item_seq IS NOT NULL", (RUN, cut))}  # fmt: skip
    run.write("DELETE FROM events WHERE run_id = ? AND seq_no > ?", (RUN, cut))
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    items = {row for table, row, _, _ in named(found) if table == "items"}
    assert items == {f"item u{seq} (seq {seq})" for seq in lost}
    assert ("runs", "the run", "differs", "state") in named(found)


def test_a_manual_mark_given_another_operator_is_named(run: Workspace) -> None:
    run.write("UPDATE decisions SET operator = 'mallory' WHERE run_id = ?", (RUN,))
    found = verdict(run, RUN)
    assert named(found) == {("decisions", "decision 1", "differs", "operator")}
    assert (found.findings[0].stored, found.findings[0].expected) == ("mallory", "carol")


def test_a_manual_mark_rewritten_in_its_event_too_is_named_by_the_chain(run: Workspace) -> None:
    """The row and its event both say mallory: the replay agrees with the rows, and only
    the key shows the event is not the one written."""
    mark = event_no(run, "decision", 5)
    run.write("UPDATE decisions SET operator = 'mallory' WHERE run_id = ?", (RUN,))
    run.write("UPDATE events SET detail = REPLACE(detail, 'carol', 'mallory') "
              "WHERE run_id = ? AND seq_no = ?", (RUN, mark))  # fmt: skip
    assert named(verdict(run, RUN)) == {("events", f"event {mark}", "differs", "hash")}


@pytest.mark.parametrize(
    ("kind", "item_seq", "detail"),
    [
        ("decision", 5, '{"decision": "sent", "evidence": "relay log line 7"}'),
        ("planned", None, '{"items": "six"}'),
    ],
    ids=["a-mark-without-its-operator", "a-plan-with-a-count-of-text"],
)
def test_an_event_missing_what_its_kind_records_is_named_not_a_crash(
    run: Workspace, kind: str, item_seq: int | None, detail: str
) -> None:
    """An event whose detail lacks what every event of its kind records (a manual mark's
    operator; a plan's count of items, as a number) was written by no version of notifier:
    the replay names it as illegal, beside the chain, instead of failing on it."""
    (edited,) = (e.seq_no for e in run.ledger.events(kind, RUN) if e.item_seq == item_seq)
    run.write("UPDATE events SET detail = ? WHERE run_id = ? AND seq_no = ?", (detail, RUN, edited))
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert {
        ("events", f"event {edited}", "differs", "hash"),
        ("events", f"event {edited}", "illegal", "detail"),
    } <= named(found)


def test_a_start_whose_time_is_not_a_time_is_named_not_a_crash(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """u1 was throttled once, then sent: its second start's time, edited to no time at
    all, is named (the replay counts how long the attempt waited from it)."""
    keyed(monkeypatch)

    def throttled_once(intent: Intent, tries: int) -> Response:
        return Response(Kind.THROTTLE) if intent.seq == 1 and tries == 0 else DELIVER

    send(ws, RUN, 2, throttled_once)
    starts = [e.seq_no for e in ws.ledger.events("start", RUN) if e.item_seq == 1]
    assert len(starts) == 2
    ws.write("UPDATE events SET at = 'yesterday' WHERE run_id = ? AND seq_no = ?",
             (RUN, starts[1]))  # fmt: skip
    found = verdict(ws, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert ("events", f"event {starts[1]}", "illegal", "at") in named(found)


def test_a_chain_keyed_with_another_key_is_named(run: Workspace) -> None:
    found = verdict(run, RUN, Signer(b"another key"))
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("runs", "the run", "differs", "audit_key_id")}


Forge = Callable[[Workspace], None]


def forge_end_to_end(ws: Workspace) -> int:
    """u2 (unknown) made sent, with its events, and every link from there on computed
    again as anyone without the key can: SHA-256. Returns the first event forged."""
    seq_no, _ = last_event(ws)
    ws.write("UPDATE items SET state = 'sent' WHERE run_id = ? AND seq = 2", (RUN,))
    ws.write(
        "INSERT INTO events (run_id, seq_no, at, kind, item_seq, detail) VALUES "
        '(?, ?, \'t\', \'mark_sent\', 2, \'{"from": "unknown", "to": "sent"}\')',
        (RUN, seq_no + 1),
    )
    ws.write("UPDATE runs SET audit_chain = 'sha256', audit_key_id = NULL WHERE run_id = ?",
             (RUN,))  # fmt: skip
    prev = None
    for n, at, kind, item_seq, detail in ws.query(
        "SELECT seq_no, at, kind, item_seq, detail FROM events WHERE run_id = ? ORDER BY seq_no",
        (RUN,),
    ):
        link = UNKEYED.link(prev, RUN, n, kind, item_seq, detail, at)
        ws.write("UPDATE events SET prev_hash = ?, hash = ? WHERE run_id = ? AND seq_no = ?",
                 (prev, link, RUN, n))  # fmt: skip
        prev = link
    return seq_no + 1


def test_a_chain_forged_end_to_end_without_the_key(run: Workspace) -> None:
    """Found with the key (the run's chain is not keyed with it); without one, all that
    can be said is that the chain is unkeyed, which proves nothing against an editor."""
    forge_end_to_end(run)
    with_key = verdict(run, RUN)
    assert with_key.verdict is AuditVerdict.ALTERED
    assert ("runs", "the run", "differs", "audit_chain") in named(with_key)
    without = verdict(run, RUN, UNKEYED)
    assert (without.verdict, without.findings) == (AuditVerdict.UNKEYED, ())


def test_a_chain_forged_under_the_runs_key_id_is_named_event_by_event(run: Workspace) -> None:
    """The forger keeps the run's key id and chain kind: every link they computed fails
    the key, each named."""
    first = forge_end_to_end(run)
    run.write("UPDATE runs SET audit_chain = 'hmac-sha256', audit_key_id = ? WHERE run_id = ?",
              (Signer(KEY.encode()).key_id, RUN))  # fmt: skip
    found = verdict(run, RUN)
    hashes = {row for table, row, _, column in named(found) if column == "hash"}
    assert hashes == {f"event {n}" for n in range(1, first + 1)}
    assert verdict(run, RUN, UNKEYED).verdict is AuditVerdict.UNKEYED


def keyed_send_held_from_3(
    ws: Workspace,
    monkeypatch: pytest.MonkeyPatch,
    concurrency: int,
    on_send: Callable[[int], None] = lambda seq: None,
) -> tuple[Worker, threading.Event]:
    """A keyed send of run `stopped` (30 items) in a thread, every sender holding an item
    from the third on until the event returned is set (`on_send` told each item's seq as it
    goes); returned once they all hold one, with the key gone from this process's
    environment, as from an operator's shell without it."""
    keyed(monkeypatch)
    held: set[int] = set()
    go_on = threading.Event()

    def held_from_3(intent: Intent, tries: int) -> Response:
        on_send(intent.seq)
        if intent.seq >= 3:
            held.add(intent.seq)
            go_on.wait(WAIT_S)
        return DELIVER

    sending = Worker(lambda: send(ws, "stopped", 30, held_from_3, concurrency=concurrency)[0])
    wait_for(lambda: len(held) == concurrency, "every sender holding an item")
    monkeypatch.delenv(KEY_ENV)
    return sending, go_on


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_cancel_without_the_key_still_stops_a_keyed_run(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    """The operator's cancel is never refused for want of the audit key: run by a process
    without it while a keyed send is under way (every sender holding an item, more claimed
    ahead at 8), it sets the flag the worker reads; no item starts after it, the worker
    stops and closes the run, and the chain (written by the worker, which holds the key)
    verifies keyed."""
    late: list[int] = []
    flagged = threading.Event()
    sending, go_on = keyed_send_held_from_3(
        ws, monkeypatch, concurrency, lambda seq: late.append(seq) if flagged.is_set() else None
    )
    cancelling = threading.Thread(
        target=lambda: Notifier.open(ws.db, config=config()).cancel("stopped", wait_s=WAIT_S),
        daemon=True,
    )
    cancelling.start()
    wait_for(lambda: ws.ledger.run("stopped").cancel_requested_at is not None, "the cancel flag")
    flagged.set()
    go_on.set()
    ended = sending.result()
    cancelling.join(WAIT_S)
    assert ended.state is RunState.CANCELLED
    assert ws.ledger.run("stopped").state == "cancelled"
    assert late == []
    assert ws.ledger.receipt_count() == 2 + concurrency
    monkeypatch.setenv(KEY_ENV, KEY)
    whole = verdict(ws, "stopped")
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_cancel_without_the_key_that_finds_the_worker_gone_reports_the_run_it_closed(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    """The worker closes the run as cancelled and leaves between the cancel's read of the
    run and its look for a live worker: the cancel, run without the audit key, reports the
    run cancelled. It never takes the run over to cancel it itself (writing a keyed run's
    chain, which it cannot without the key: it stopped with an error after the run was
    closed)."""
    sending, go_on = keyed_send_held_from_3(ws, monkeypatch, concurrency)
    real = membership.live_holder

    def once_the_worker_has_left(store: Any, run: Any) -> Any:
        go_on.set()
        assert sending.result().state is RunState.CANCELLED  # closed by the worker, gone
        return real(store, run)

    monkeypatch.setattr(settling, "live_holder", once_the_worker_has_left)
    result = Notifier.open(ws.db, config=config()).cancel("stopped", wait_s=WAIT_S)
    assert result.run.state is RunState.CANCELLED
    assert ws.ledger.run("stopped").state == "cancelled"
    monkeypatch.setenv(KEY_ENV, KEY)
    whole = verdict(ws, "stopped")
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())


def test_a_chain_stripped_from_a_run_planned_after_the_chain_is_named(run: Workspace) -> None:
    """Clearing a keyed run's chain columns and every hash does not make it pass as planned
    before the chain: the database began chaining before the run was planned, so its missing
    chain is named, and the replay still names the item edited with it."""
    run.write("UPDATE runs SET audit_chain = NULL, audit_key_id = NULL WHERE run_id = ?", (RUN,))
    run.write("UPDATE events SET prev_hash = NULL, hash = NULL WHERE run_id = ?", (RUN,))
    run.write("UPDATE items SET state = 'sent' WHERE run_id = ? AND seq = 2", (RUN,))
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) >= {
        ("runs", "the run", "missing", "audit_chain"),
        ("items", "item u2 (seq 2)", "differs", "state"),
    }


def test_an_event_naming_an_item_far_past_the_run_is_named_at_once(
    run: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event moved to an item number no item holds (however large) is replayed with the
    last slice of items and named, in as many slices as the items fill (one, here), not one
    per 5,000 numbers up to it."""
    seq_no = event_no(run, "start", 3)
    run.write("UPDATE events SET item_seq = 2000000000 WHERE run_id = ? AND seq_no = ?",
              (RUN, seq_no))  # fmt: skip
    slices: list[range] = []
    read = AuditRecords.rows

    def counted(self: AuditRecords, run_id: str, seqs: range) -> RunRows:
        slices.append(seqs)
        return read(self, run_id, seqs)

    monkeypatch.setattr(AuditRecords, "rows", counted)
    found = verdict(run, RUN, UNKEYED)
    assert ("events", f"event {seq_no}", "illegal", "item_seq") in named(found)
    assert len(slices) == 1


def test_a_target_and_payload_rewritten_under_their_old_digest_are_named(run: Workspace) -> None:
    """u3's recipient and words rewritten, its digest left: the digest verify recomputes
    from what the row holds is not the one stored."""
    rewrite_intent(run, RUN, 3, digest=False)
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("items", "item u3 (seq 3)", "differs", "intent_digest")}


def test_an_intent_rewritten_with_its_digest_is_named_by_the_run_fingerprint(
    run: Workspace,
) -> None:
    """u3 rewritten with a digest that matches it: the run's fingerprint no longer covers
    the digests stored."""
    rewrite_intent(run, RUN, 3)
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("runs", "the run", "differs", "fingerprint")}


def test_an_intent_and_the_run_fingerprint_rewritten_together_are_named_by_the_chain(
    run: Workspace,
) -> None:
    """u3, its digest and the run's fingerprint all rewritten to agree: the fingerprint the
    plan chained under the key is not the one stored."""
    rewrite_intent(run, RUN, 3)
    forged = stored_fingerprint(run, RUN)
    run.write("UPDATE runs SET fingerprint = ? WHERE run_id = ?", (forged, RUN))
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("runs", "the run", "differs", "fingerprint")}
    (difference,) = found.findings
    assert difference.stored == forged and difference.expected != forged


def test_a_channel_definition_rewritten_is_named_by_the_run_fingerprint(run: Workspace) -> None:
    """The channel's URL in the run's snapshot pointed elsewhere: the intents still hash to
    their digests, but not with this snapshot to the run's fingerprint."""
    ((snapshot,),) = run.query("SELECT channel_snapshot FROM runs WHERE run_id = ?", (RUN,))
    moved = snapshot.replace("127.0.0.1:9", "mallory.example.net")
    assert moved != snapshot
    run.write("UPDATE runs SET channel_snapshot = ? WHERE run_id = ?", (moved, RUN))
    assert named(verdict(run, RUN)) == {("runs", "the run", "differs", "fingerprint")}


def test_an_approval_forged_on_a_run_never_approved_is_named(run: Workspace) -> None:
    approval = {"operator": "mallory", "approved_at": "2026-01-01T00:00:00+00:00",
                "expires_at": "2099-01-01T00:00:00+00:00", "fingerprint": "sha256:00",
                "state_version": 1}  # fmt: skip
    run.write("UPDATE runs SET approval = ? WHERE run_id = ?", (json.dumps(approval), RUN))
    found = verdict(run, RUN)
    assert named(found) == {("runs", "the run", "differs", "approval")}
    (difference,) = found.findings
    assert (difference.stored, difference.expected) == (approval, None)


@pytest.mark.parametrize(
    ("table", "column", "named_as"),
    [("items", "intent_digest", "intent_digest"), ("items", "payload", "intent_digest"),
     ("runs", "channel_snapshot", "fingerprint"), ("runs", "approval", "approval"),
     ("runs", "fingerprint", "fingerprint")],
)  # fmt: skip
def test_a_blob_written_where_text_belongs_is_named_not_a_crash(
    run: Workspace, table: str, column: str, named_as: str
) -> None:
    """SQLite keeps bytes in a TEXT column, and PostgreSQL keeps the text of what is not
    JSON: either way what it breaks is named (exit 5), never a traceback."""
    value: object = b"\xff\x00" if run.url == "" else "\\xff00"
    where = "run_id = ? AND seq = 2" if table == "items" else "run_id = ?"
    run.write(f"UPDATE {table} SET {column} = ? WHERE {where}", (value, RUN))
    found = verdict(run, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named_as in {d.column for d in found.findings}
