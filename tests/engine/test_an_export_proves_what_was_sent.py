"""`notifier export` writes one run to a standalone SQLite file (through sqlite-utils) that an
auditor searches and checks with nothing else: `notifier verify FILE` checks every row's
seal, each table against the manifest, the manifest's signature, then the run's chain and
replay. An edited row is named; a file resealed with another key is named as such. Each on
both stores, against a run sent under the audit key: u2 and u5 lost their answers, u5 then
marked sent by carol, and user4's address on the suppression list before the send."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from notifier.api import Notifier, VerifiedFile
from notifier.channels.scripted import DELIVER, LOST_AFTER_COMMIT, Response, throttle
from notifier.domain.chain import KEY_ENV, Signer
from notifier.domain.intent import Intent
from notifier.store import audit_file
from notifier.store.audit_file import PARTS, manifest_form, row_form, seal

from ..conftest import Workspace
from ..support.audited import KEY, TOML, config, keyed, rewrite_intent, send, stored_fingerprint

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "audited"


def lose_2_and_5(intent: Intent, tries: int) -> Response:
    return LOST_AFTER_COMMIT if intent.seq in (2, 5) else DELIVER


@pytest.fixture
def run(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    keyed(monkeypatch)
    (ws.path / "notifier.toml").write_text(TOML)
    added = ws.invoke("suppress", "add", "USER4@example.com", "--reason", "asked to stop")
    assert added.exit_code == 0, added.output
    send(ws, RUN, 6, lose_2_and_5)
    marked = ws.invoke(
        "reconcile", RUN, "--manual", "--item", "u5", "--mark", "sent",
        "--evidence", "relay log line 7", env={"USER": "carol"},
    )  # fmt: skip
    assert marked.exit_code in (0, 3), marked.output
    return ws


def export(ws: Workspace, name: str = "audit.db", *, with_bodies: bool = False) -> Path:
    to = ws.path / name
    Notifier.open(ws.db, config=config()).export(RUN, to, with_bodies=with_bodies)
    return to


def edit(path: Path, *statements: str) -> None:
    """Change an exported file behind notifier's back, as an editor would."""
    with sqlite3.connect(path) as conn:
        conn.executescript(";\n".join(statements))


def checked(path: Path) -> VerifiedFile:
    """verify_export's result on `path` under the process's key, from a Notifier whose
    database does not exist: the file is all it reads."""
    return Notifier.open(path.parent / "elsewhere.db", config=config()).verify_export(path)


def assert_same_rows(one: Path, other: Path) -> None:
    """Two exported files hold the same rows, seals included, table by table."""
    for part in PARTS:
        read = f'SELECT * FROM "{part.name}" ORDER BY {", ".join(part.key)}'
        with sqlite3.connect(one) as a, sqlite3.connect(other) as b:
            assert a.execute(read).fetchall() == b.execute(read).fetchall(), part.name


def findings(result: VerifiedFile) -> set[tuple[str, str, str | None]]:
    return {(d.table.value, d.row, d.column) for d in result.findings} | {
        (d.table.value, d.row, d.column) for v in result.runs for d in v.findings
    }


def test_an_export_holds_the_run_and_verifies_alone(run: Workspace) -> None:
    """The file holds every table's rows, searchable by recipient, without bodies; verified
    with the key and nothing else (the database it came from is gone), everything holds."""
    path = export(run)
    db = sqlite_utils.Database(path)
    assert db["items"].count == 6
    assert {r["item_id"]: r["state"] for r in db["items"].rows} == {
        "u1": "sent", "u2": "unknown", "u3": "sent", "u4": "suppressed", "u5": "sent",
        "u6": "sent",
    }  # fmt: skip
    (hit,) = db.table("items").search("user3@example.com", quote=True)
    assert hit["item_id"] == "u3" and hit["receipt_id"]
    assert db["bodies"].count == 0 and "payload" not in db["items"].columns_dict
    assert [(r["address"], r["reason"]) for r in db["suppressions"].rows] == [
        ("user4@example.com", "asked to stop")
    ]
    assert [(r["seq"], r["operator"]) for r in db["decisions"].rows] == [(5, "carol")]
    db.close()
    result = checked(path)
    assert result.findings == () and [v.verdict.value for v in result.runs] == ["keyed"]


def test_bodies_are_exported_only_when_asked_for(run: Workspace) -> None:
    path = export(run, with_bodies=True)
    db = sqlite_utils.Database(path)
    bodies = {r["seq"]: json.loads(r["payload"]) for r in db["bodies"].rows}
    assert len(bodies) == 6 and "Body of 3" in json.dumps(bodies[3])
    db.close()
    assert checked(path).findings == ()


def test_an_edited_row_of_an_export_is_named(run: Workspace) -> None:
    """A recipient rewritten in the file (a column replay cannot see) is named by its seal;
    an item's state rewritten is named by its seal and by the replay."""
    path = export(run)
    edit(path, "UPDATE items SET recipient = 'other@example.com' WHERE seq = 3",
         "UPDATE items SET state = 'sent' WHERE seq = 2")  # fmt: skip
    found = findings(checked(path))
    assert ("items", "item seq 3", "seal") in found
    assert ("items", "item seq 2", "seal") in found
    assert ("items", "item u2 (seq 2)", "state") in found


def test_a_blob_written_into_an_export_is_named_by_its_seal_never_a_crash(
    run: Workspace,
) -> None:
    """A value no export writes (a blob, which no seal's JSON can hold) is named by the
    row's seal, as any other edit is, never an internal error."""
    path = export(run)
    edit(path, "UPDATE items SET recipient = X'6d616c6c6f7279' WHERE seq = 3")
    assert ("items", "item seq 3", "seal") in findings(checked(path))


def test_a_row_deleted_from_an_export_is_found(run: Workspace) -> None:
    path = export(run)
    edit(path, "DELETE FROM suppressions", "DELETE FROM attempts WHERE seq = 3")
    found = findings(checked(path))
    assert ("manifest", "suppressions", "rows") in found
    assert ("manifest", "attempts", "rows") in found
    assert any(table == "attempts" and "seq 3" in row for table, row, _ in found)


def test_an_export_resealed_with_another_key_is_named(
    run: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exported again under another key, the file is whole by its own seals, but verified
    with the auditors' key it is named as sealed with another key."""
    monkeypatch.setenv(KEY_ENV, "an editor's key")
    path = export(run)
    monkeypatch.setenv(KEY_ENV, KEY)
    assert findings(checked(path)) >= {("seal", "the file", "key_id")}


def test_an_export_forged_without_the_key_is_named_row_by_row(run: Workspace) -> None:
    """An editor who rewrites a row and recomputes its seal, the manifest and the signature,
    without the key (plain SHA-256, the key's id kept), is caught by every seal it touched
    and by the signature."""
    path = export(run)
    unkeyed = Signer()
    with sqlite3.connect(path) as conn:
        items = next(p for p in PARTS if p.name == "items")
        columns = ", ".join(items.columns)
        row = conn.execute(f"SELECT {columns} FROM items WHERE seq = 3").fetchone()
        forged = (*row[:3], "other@example.com", *row[4:])
        conn.execute(
            "UPDATE items SET recipient = ?, seal = ? WHERE seq = 3",
            ("other@example.com", seal(unkeyed, row_form("items", forged))),
        )
        digest = hashlib.sha256()
        for (stored,) in conn.execute("SELECT seal FROM items ORDER BY seq"):
            digest.update(stored.encode())
        conn.execute("UPDATE manifest SET sha256 = ? WHERE name = 'items'", (digest.hexdigest(),))
        meta = conn.execute(
            "SELECT run_id, exported_at, with_bodies, chained_since FROM seal"
        ).fetchone()
        listed = conn.execute("SELECT name, rows, sha256 FROM manifest").fetchall()
        order = [p.name for p in PARTS]
        listed.sort(key=lambda m: order.index(m[0]))
        signature = seal(unkeyed, manifest_form(meta[0], meta[1], bool(meta[2]), meta[3], listed))
        conn.execute("UPDATE seal SET signature = ?", (signature,))
    found = findings(checked(path))
    assert ("items", "item seq 3", "seal") in found
    assert ("seal", "the file", "signature") in found
    assert not any(table == "manifest" for table, _, _ in found)


def test_an_export_of_a_run_sent_at_concurrency_8_verifies_and_names_an_edit(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forty items sent eight at a time, claimed ahead, every fifth answer lost and every
    seventh throttled first: the file holds each item as the database does and verifies
    keyed; an attempt's outcome rewritten in it is named by its seal and by the replay."""
    keyed(monkeypatch)

    def faults(intent: Intent, tries: int) -> Response:
        if tries == 0 and intent.seq % 5 == 0:
            return LOST_AFTER_COMMIT
        if tries == 0 and intent.seq % 7 == 0:
            return throttle(0.01)
        return DELIVER

    send(ws, RUN, 40, faults, concurrency=8)
    path = export(ws)
    db = sqlite_utils.Database(path)
    exported = {r["item_id"]: r["state"] for r in db["items"].rows}
    db.close()
    assert exported == {i.item_id: i.state for i in ws.ledger.items(RUN)}
    assert "unknown" in exported.values() and "sent" in exported.values()
    result = checked(path)
    assert result.findings == () and [v.verdict.value for v in result.runs] == ["keyed"]
    edit(path, "UPDATE attempts SET outcome = 'sent' WHERE seq = 5 AND n = 1")
    found = findings(checked(path))
    assert ("attempts", "attempt seq 5, n 1", "seal") in found
    assert ("attempts", "attempt 1 of item u5 (seq 5)", "outcome") in found


def test_a_large_run_is_sealed_and_checked_in_a_second_process_as_in_one(
    run: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above APART_ABOVE_ITEMS items an export seals its rows in a second process, and
    verify checks a file's seals in one beside the replay: the file is the one a single
    process writes, row for row and seal for seal, it verifies keyed, and an edited row is
    named as it is by a single process."""
    alone = export(run, "alone.db")
    handed: list[Any] = []
    submit = ProcessPoolExecutor.submit

    def counted(self: ProcessPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        handed.append(fn.__name__)
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counted)
    monkeypatch.setattr(audit_file, "APART_ABOVE_ITEMS", 0)
    # Threads a test run leaves behind (another test's) would keep the fork from happening.
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    apart = export(run, "apart.db")
    assert "seal_rows" in handed
    assert_same_rows(alone, apart)
    result = checked(apart)
    assert "check_file" in handed
    assert result.findings == () and [v.verdict.value for v in result.runs] == ["keyed"]
    edit(apart, "UPDATE items SET recipient = 'other@example.com' WHERE seq = 3")
    assert ("items", "item seq 3", "seal") in findings(checked(apart))


def test_a_large_run_that_cannot_fork_is_sealed_and_checked_here(
    run: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no second process can start (a process limit: fork fails with EAGAIN), the
    export seals and verify checks in this process: the same file, verified keyed, never an
    internal error."""
    alone = export(run, "alone.db")

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(audit_file, "APART_ABOVE_ITEMS", 0)
    here = export(run, "here.db")
    assert_same_rows(alone, here)
    result = checked(here)
    assert result.findings == () and [v.verdict.value for v in result.runs] == ["keyed"]


def test_an_export_never_writes_over_a_file(run: Workspace) -> None:
    path = run.path / "audit.db"
    path.write_text("kept")
    result = run.invoke("export", RUN, "--to", str(path))
    assert result.exit_code == 2, result.output
    assert "already exists" in result.output
    assert path.read_text() == "kept"


def test_export_and_verify_on_the_command_line(run: Workspace) -> None:
    """The commands: `export` says what it wrote; `verify FILE` exits 0 on the file as
    written and 5, naming the row, once a row is edited."""
    path = run.path / "audit.db"
    exported = run.invoke("export", RUN, "--to", str(path))
    assert exported.exit_code == 0, exported.output
    assert f"exported run {RUN} to {path}: 6 items" in exported.output
    assert f"`notifier verify {path}` checks it" in exported.output
    whole = run.invoke("verify", str(path))
    assert whole.exit_code == 0, whole.output
    edit(path, "UPDATE receipts SET receipt_id = 'forged' WHERE seq = 1")
    edited = run.invoke("verify", str(path), "--json")
    assert edited.exit_code == 5, edited.output
    document = json.loads(edited.output)
    assert {f["row"] for f in document["findings"]} >= {"receipt seq 1"}


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        ("ALTER TABLE items ADD COLUMN delivered_to_inbox TEXT", ("manifest", "items", "columns")),
        ("CREATE VIEW delivered AS SELECT * FROM items", ("manifest", "delivered", "view")),
        ("CREATE TABLE notes (x)", ("manifest", "notes", "table")),
        ("DROP TABLE bodies", ("manifest", "bodies", "table")),
        ("DELETE FROM runs", ("runs", "the run", "rows")),
        ("DELETE FROM seal", ("seal", "the file", "rows")),
        ("UPDATE events SET item_seq = 'x' WHERE seq_no = 3", ("events", "event seq_no 3", "seal")),
    ],
    ids=["column-added", "view-added", "table-added", "table-dropped", "run-deleted",
         "seal-deleted", "text-for-a-number"],
)  # fmt: skip
def test_an_export_changed_in_its_structure_is_named(
    run: Workspace, tamper: str, expected: tuple[str, str, str]
) -> None:
    """A file whose tables, columns, views or single rows are not what an export writes is
    altered (exit 5 on the command line), never read as a healthy file or refused as no
    audit file at all."""
    path = export(run)
    edit(path, tamper)
    assert expected in findings(checked(path))
    said = run.invoke("verify", str(path))
    assert said.exit_code == 5, said.output


@pytest.mark.parametrize("with_bodies", [False, True], ids=["without-bodies", "with-bodies"])
def test_an_intent_rewritten_before_the_export_is_named_in_the_file(
    run: Workspace, with_bodies: bool
) -> None:
    """u2's recipient, words and digest (it has no receipt, which would hold the digest
    too), and the run's fingerprint, rewritten in the database to agree before it is
    exported: the file is whole by its seals, but the fingerprint the plan chained under
    the key is not the run's."""
    rewrite_intent(run, RUN, 2)
    run.write("UPDATE runs SET fingerprint = ? WHERE run_id = ?", (stored_fingerprint(run, RUN),
                                                                  RUN))  # fmt: skip
    result = checked(export(run, with_bodies=with_bodies))
    assert result.findings == ()
    assert [v.verdict.value for v in result.runs] == ["altered"]
    assert findings(result) == {("runs", "the run", "fingerprint")}


def test_an_intent_rewritten_before_the_export_under_its_old_digest_is_named_by_its_body(
    run: Workspace,
) -> None:
    """u2's recipient and words rewritten, its digest left: a file with bodies recomputes
    the digest and names u2; a file without them holds nothing the digest was made of, and
    the run's fingerprint still covers the digests it holds."""
    rewrite_intent(run, RUN, 2, digest=False)
    assert findings(checked(export(run, "bodies.db", with_bodies=True))) == {
        ("items", "item u2 (seq 2)", "intent_digest")
    }
    assert findings(checked(export(run, "plain.db"))) == set()
