"""A streamed plan that stores all or nothing, per-run counters kept
with every move (m004), indexed attention queries, and a report that streams its items."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest

from notifier.content.plan import fingerprint_of
from notifier.domain.intent import content_fingerprint, run_fingerprint
from notifier.ops import report
from notifier.store.sqlite import SqliteEngine

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {
            name: sorted(conn.execute(f"SELECT * FROM {name}"))
            for name in ("runs", "items", "events", "run_counts")
        }
    finally:
        conn.close()


def test_a_bad_last_row_in_a_large_file_stores_nothing(ws: Workspace) -> None:
    """50,000 good rows then one bad one: no database is created, and the message names the
    bad row's line (50,002: the header is line 1)."""
    rows = make_rows(50_000)
    rows.append(["last", "", "Hi", "Body", "x"])  # empty `to`
    ws.write_csv("big.csv", rows)
    result = ws.invoke("send", "big.csv")
    assert result.exit_code == 2, result.output
    assert "line 50002: empty `to`" in result.output
    assert "nothing was stored" in result.output
    assert not ws.db_file.exists()


def test_a_bad_last_row_leaves_an_existing_database_unchanged(ws: Workspace) -> None:
    """With a database that already holds a run, a large file whose last row is bad adds no
    run, no item, no event and no counter."""
    ws.write_csv("small.csv", make_rows(3))
    assert ws.invoke("send", "small.csv").exit_code == 0
    before = _tables(ws.db_file)
    rows = make_rows(20_000, start=100)
    rows.append(["u100", "late@example.com", "Hi", "Body", "x"])  # row 1's id again
    ws.write_csv("big.csv", rows)
    result = ws.invoke("send", "big.csv")
    assert result.exit_code == 2, result.output
    assert "line 20002: duplicate id 'u100' (first used on line 2)" in result.output
    assert _tables(ws.db_file) == before


def test_every_problem_is_counted_though_only_the_first_are_kept(ws: Workspace) -> None:
    """A file with 3,000 bad rows lists the first 20 with their lines and counts the rest."""
    rows = make_rows(3_000)
    for row in rows[1:]:
        row[1] = ""
    ws.write_csv("bad.csv", rows)
    result = ws.invoke("send", "bad.csv")
    assert result.exit_code == 2, result.output
    assert "3000 problems; nothing was stored." in result.output
    assert "line 2: " in result.output and "line 21: " in result.output
    assert "line 22: " not in result.output
    assert "… and 2980 more." in result.output
    assert not ws.db_file.exists()


def test_dry_run_of_a_streamed_plan_writes_nothing(ws: Workspace) -> None:
    """--dry-run streams the whole file, prints the count and fingerprint the real send then
    stores, and creates no database."""
    ws.write_csv("batch.csv", make_rows(2_000))
    dry = ws.invoke("send", "batch.csv", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 2000 notifications" in dry.output
    assert not ws.db_file.exists()
    sent = ws.invoke("send", "batch.csv", "--concurrency", "16")  # the plan is what counts
    assert sent.exit_code == 0, sent.output
    [fingerprint] = [line for line in dry.output.splitlines() if line.startswith("fingerprint")]
    assert fingerprint in sent.output
    assert len(ws.ledger.items()) == 2000


def test_incremental_fingerprints_equal_the_list_formulas() -> None:
    """The running hash gives exactly intent.run_fingerprint and intent.content_fingerprint
    (the formula m002 back-fills), so approvals and "already planned" do not change."""
    import hashlib  # noqa: PLC0415

    from notifier.domain.intent import canonical_json  # noqa: PLC0415

    digests = [f"sha256:{n:064x}" for n in range(5)]
    snapshot = {"hooks": {"type": "webhook", "url": "https://x.example/é"}, "outbox": {}}
    running = hashlib.sha256()
    for digest in digests:
        running.update(digest.encode("ascii") + b"\n")
    assert fingerprint_of(running, canonical_json(snapshot)) == run_fingerprint(digests, snapshot)
    assert fingerprint_of(running, canonical_json(sorted(snapshot))) == content_fingerprint(
        digests, snapshot.keys()
    )


def test_an_m003_database_gains_counters_and_resumes(ws: Workspace) -> None:
    """A database written by the code before m004 (a completed run, and a run whose worker
    died with item 12 in flight) gains back-filled counters on open; resume settles item 12
    without re-writing it, sends 13-30 once each, and the counters follow every move."""
    shutil.copy(FIXTURES / "m004-inflight-run.db", ws.db_file)
    shutil.copytree(FIXTURES / "m004-inflight-run.outbox", ws.outbox)
    before = {d["idempotency_key"]: d["written_at"] for d in ws.outbox_documents()}
    assert len(before) == 22
    status = ws.status()  # read-only: counts from the rows, no migration yet
    assert status["counts"] == {
        "total": 30,
        "pending": 18,
        "in_flight": 1,
        "sent": 11,
        "unknown": 0,
        "failed": 0,
        "expired": 0,
        "suppressed": 0,
    }
    assert ws.query("SELECT name FROM sqlite_master WHERE name = 'run_counts'") == []
    resumed = ws.invoke("resume", "m004-fixture")
    assert resumed.exit_code == 0, resumed.output
    assert "resuming run m004-fixture: 11 sent, 1 in flight, 0 unknown, 0 failed, 18 pending" in (
        resumed.output
    )
    assert "completed: 30 sent, 0 unknown, 0 failed, 0 pending" in resumed.output
    assert "m004_counts_and_attention_indexes" in ws.ledger.migrations()
    assert ws.ledger.counters() == {
        ("m004-done", "sent", 10),
        ("m004-fixture", "sent", 30),
    }
    documents = ws.outbox_documents()
    assert len(documents) == 40  # 10 + 30: each item written exactly once
    # The files written before the upgrade (items 1-12 included) were not written again.
    for document in documents:
        key = document["idempotency_key"]
        assert before.get(key, document["written_at"]) == document["written_at"], key
    runs = ws.invoke("runs")
    assert runs.exit_code == 0 and "m004-done" in runs.output


def test_counters_follow_a_crash_and_a_cancel(ws: Workspace) -> None:
    """Counts read from the counters match the rows through a crash mid-send and a cancel
    that settles the in-flight item (the ws fixture re-checks the counters at teardown)."""
    ws.write_csv("batch.csv", make_rows(40))
    crash_invoke(ws, "after-send:7", "send", "batch.csv")
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 3, cancelled.output  # cancelled with items never sent
    assert "cancelled" in cancelled.output
    counts = ws.status()["counts"]
    assert counts["total"] == 40 and counts["in_flight"] == 0
    assert counts["sent"] + counts["pending"] + counts["unknown"] == 40
    assert ws.ledger.run_counts() == ws.ledger.state_counts()


def test_the_streamed_json_report_is_the_json_document(ws: Workspace) -> None:
    """`report --format json` written piece by piece is exactly json.dumps(indent=2) of the
    same report object, with every item, and the CSV has one row per item."""
    ws.write_csv("batch.csv", make_rows(1_200))
    # Sent in groups of 16: the report is what is pinned, not sending one at a time.
    assert ws.invoke("send", "batch.csv", "--concurrency", "16").exit_code == 0
    printed = ws.invoke("report", "--format", "json")
    assert printed.exit_code == 0, printed.output
    data = json.loads(printed.output)
    assert len(data["items"]) == 1_200 and data["counts"]["sent"] == 1_200
    assert printed.output == json.dumps(data, ensure_ascii=False, indent=2) + "\n"
    empty = dict(data, items=[], decisions=[])
    assert "".join(report.iter_json(empty)) == json.dumps(empty, ensure_ascii=False, indent=2)
    as_csv = ws.invoke("report", "--format", "csv")
    assert as_csv.exit_code == 0
    assert len(as_csv.output.splitlines()) == 1_201


def _plans(ws: Workspace, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> list[str]:
    """The queries `command` issues that walk a whole table of rows: SQLite's plan (EXPLAIN
    QUERY PLAN) for every SELECT it ran, keeping each SCAN of items, attempts or events."""
    seen: list[str] = []
    original = SqliteEngine._connect

    def traced(*args: Any, **kwargs: Any) -> SqliteEngine:
        engine = original(*args, **kwargs)
        engine.conn.set_trace_callback(seen.append)
        return engine

    with monkeypatch.context() as patch:
        patch.setattr(SqliteEngine, "_connect", traced)
        result = ws.invoke(*command)
    assert result.exit_code in (0, 3), result.output
    conn = sqlite3.connect(f"file:{ws.db_file}?mode=ro", uri=True)
    scans: list[str] = []
    # Partial indexes hold only the few rows they are about, except these two, which hold
    # every pending item of a run: a million of them before a run starts.
    every_pending = ("items_active", "items_pending_channel")
    partial_indexes = [
        r[0]
        for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE '%WHERE%'")
        if r[0] not in every_pending
    ]
    try:
        for sql in seen:
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            if "LIMIT 1" in sql or sql.startswith(("SELECT MIN(", "SELECT MAX(")):
                continue  # one row from an index's edge
            if sql.startswith("SELECT r.run_id FROM runs r WHERE") and "EXISTS" in sql:
                continue  # per run (a handful), an EXISTS that stops at the first item
            for row in conn.execute("EXPLAIN QUERY PLAN " + sql):
                detail = row[-1]
                # A walk over a run's rows: a SCAN of a table or of one of its full indexes,
                # or a SEARCH on the run id alone through one.
                words = detail.split()
                table = words[1] if words[0] in ("SCAN", "SEARCH") else ""
                small = any(f"INDEX {name} " in detail + " " for name in partial_indexes)
                walk = words[0] == "SCAN" or detail.endswith("(run_id=?)")
                if table in ("items", "i", "attempts", "a", "events", "e") and walk and not small:
                    scans.append(f"{sql} -> {detail}")
    finally:
        conn.close()
    return scans


def test_status_and_resume_start_up_read_only_what_needs_attention(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No query `status`, `runs` or `resume` issues on a run scans the items, attempts or
    events tables: each goes through an index (EXPLAIN QUERY PLAN). (`report` lists every
    item, streamed, by design.)"""
    ws.write_csv("batch.csv", make_rows(300))
    crash_invoke(ws, "after-send:5", "send", "batch.csv")
    for command in (["status"], ["runs"], ["resume"]):
        assert _plans(ws, monkeypatch, command) == [], command


def test_the_plan_stage_leaves_no_file_behind(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scratch file a plan is staged in (and attached from, to be copied) is removed
    after a stored plan, a refused file and a dry run alike: no intent lingers in /tmp."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ws.write_csv("good.csv", make_rows(300))
    assert ws.invoke("send", "good.csv").exit_code == 0
    assert ws.ledger.state_counts() == {"sent": 300}
    ws.write_csv("bad.csv", [*make_rows(300), ["u301", "", "no recipient", "x", "y"]])
    assert ws.invoke("send", "bad.csv").exit_code == 2
    assert ws.invoke("send", "good.csv", "--new-run", "--dry-run").exit_code == 0
    assert list(scratch.iterdir()) == []
