"""A database that is not ours, is damaged, or contradicts itself is refused (exit 4) with a
message naming the file and the problem, and is never modified."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg.pq import TransactionStatus

from notifier.domain import clock
from notifier.domain.records import AttemptOutcome, Outcome
from notifier.domain.state_machine import ItemState, ItemTrigger
from notifier.store import LeaseLost, LostRace, Store
from notifier.store import statements as sql
from notifier.store.backend import Engine
from notifier.store.postgres import PostgresEngine
from notifier.store.sqlite import SqliteEngine

from ..conftest import EXAMPLE, Workspace, make_rows

COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["resume"],
    ["report", "--format", "json"],
    ["runs"],
    ["cancel"],
    ["reconcile"],
    ["send", "other.csv"],
]


def sent_run(ws: Workspace) -> None:
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    ws.write_csv("other.csv", make_rows(3))


def tamper(ws: Workspace, *statements: str) -> None:
    conn = sqlite3.connect(ws.db_file)
    conn.execute("PRAGMA foreign_keys = OFF")
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def assert_refused_untouched(ws: Workspace, args: list[str], expected: str) -> None:
    before = ws.db_file.read_bytes()
    result = ws.invoke(*args)
    assert result.exit_code == 4, (args, result.output)
    assert str(ws.db) in result.output
    assert expected in result.output
    assert "Traceback" not in result.output
    assert ws.db_file.read_bytes() == before


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_sent_item_without_receipt_is_refused_by_every_command(
    ws: Workspace, args: list[str]
) -> None:
    """Whatever the command, a `sent` item with no receipt stops it before any write."""
    sent_run(ws)
    tamper(ws, "DELETE FROM receipts WHERE rowid = (SELECT MIN(rowid) FROM receipts)")
    assert_refused_untouched(ws, args, "is sent but has no receipt")


def test_text_file_is_refused(ws: Workspace) -> None:
    """A text file where the database should be is named and left alone."""
    ws.db_file.write_text("id,to\n1,ada@example.com\n")
    ws.write_csv("other.csv", make_rows(3))
    for args in (["status"], ["send", "other.csv"], ["resume"]):
        assert_refused_untouched(ws, args, "not an SQLite database")


def test_empty_file_is_refused_not_reset(ws: Workspace) -> None:
    """A zero-byte database is not silently treated as a new one (that would re-send)."""
    ws.db_file.write_bytes(b"")
    ws.write_csv("other.csv", make_rows(3))
    assert_refused_untouched(ws, ["send", "other.csv"], "empty (0 bytes)")


def test_truncated_database_is_refused(ws: Workspace) -> None:
    """A database cut short (disk full, bad copy) is refused, byte for byte unchanged."""
    sent_run(ws)
    data = ws.db_file.read_bytes()
    ws.db_file.write_bytes(data[: len(data) // 2])
    for args in (["status"], ["resume"], ["send", "other.csv"]):
        assert_refused_untouched(ws, args, "truncated")


def test_foreign_sqlite_database_is_refused(ws: Workspace) -> None:
    """Somebody else's SQLite file is recognised as foreign before its tables are touched."""
    conn = sqlite3.connect(ws.db_file)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT)")
    conn.commit()
    conn.close()
    ws.write_csv("other.csv", make_rows(3))
    assert_refused_untouched(ws, ["send", "other.csv"], "not written by notifier")


def test_newer_schema_is_refused(ws: Workspace) -> None:
    """A database migrated by a newer notifier is not opened by this one."""
    sent_run(ws)
    tamper(
        ws,
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
        "VALUES ('notifier', 'm999_from_the_future', '2030-01-01')",
    )
    assert_refused_untouched(ws, ["resume"], "newer version of notifier")


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        (
            [
                "UPDATE items SET state = 'in_flight' WHERE seq = 5",
                "DELETE FROM receipts WHERE idempotency_key = "
                "(SELECT idempotency_key FROM items WHERE seq = 5)",
            ],
            "is in flight but has no open attempt",
        ),
        (["DELETE FROM events WHERE seq_no = 3"], "gaps in its event numbers"),
        (["UPDATE items SET state = 'pending' WHERE seq = 7"], "completed but still has"),
    ],
    ids=["in-flight-without-attempt", "event-gap", "completed-with-pending"],
)
def test_contradictory_rows_are_refused(
    ws: Workspace, statements: list[str], expected: str
) -> None:
    """Each invariant of docs/design.md section 4 is checked on open."""
    sent_run(ws)
    tamper(ws, *statements)
    assert_refused_untouched(ws, ["status"], expected)


def planned_store(db: Path | str, items: int) -> Store:
    """A new store holding run r1, planned with `items` outbox items (keys k1, k2, …)."""
    store = Store.open(db, create=True)
    store.plans.create_run(
        {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(),
         "batch_path": "b.csv", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {}, "options": {}, "contract_version": "v1"},
        [{"run_id": "r1", "seq": n, "item_id": str(n), "channel": "outbox", "target": "a@b.c",
          "payload": {}, "idempotency_key": f"k{n}", "intent_digest": "sha256:d"}
         for n in range(1, items + 1)],
    )  # fmt: skip
    return store


def test_a_move_that_lost_a_race_fails_loudly(tmp_path: Path) -> None:
    """A conditional UPDATE that finds the item already moved raises instead of overwriting."""
    store = planned_store(tmp_path / "receipts.db", 1)
    version = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, lambda o, e: False)
    [item] = store.ledger.claim("r1", version, 1)
    store.ledger.record(
        "r1",
        version,
        [Outcome(1, ItemTrigger.ACK, AttemptOutcome.SENT, receipt_id="x", receipt_source="send")],
    )
    with pytest.raises(LostRace):
        # A second settlement that still believes the item is in flight.
        store.ledger.record(
            "r1",
            version,
            [
                Outcome(
                    1,
                    ItemTrigger.RETRY_LATER,
                    AttemptOutcome.UNCERTAIN,
                    expected=ItemState.IN_FLIGHT,
                )
            ],
        )
    assert store.queries.item("r1", 1).state.value == "sent"
    assert item.state.value == "in_flight"
    store.close()


@pytest.mark.both_stores
def test_a_group_commit_whose_acks_lost_a_race_records_none_of_them(ws: Workspace) -> None:
    """The acks batched into one group commit move all their items or none: one item
    settled behind the committer's back rolls back the receipts, attempts and moves of the
    others too (on PostgreSQL all of them are one statement)."""
    store = planned_store(ws.db, 3)
    try:
        version = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, lambda o, e: False)
        assert len(store.ledger.claim("r1", version, 3)) == 3
        settled = Outcome(
            2, ItemTrigger.RETRY_LATER, AttemptOutcome.UNCERTAIN, expected=ItemState.IN_FLIGHT
        )
        store.ledger.record("r1", version, [settled])
        acks = [
            Outcome(seq, ItemTrigger.ACK, AttemptOutcome.SENT, receipt_id=f"x{seq}",
                    receipt_source="send", expected=ItemState.IN_FLIGHT)
            for seq in (1, 2, 3)
        ]  # fmt: skip
        with pytest.raises(LostRace):
            store.ledger.step("r1", version, acks, 0)
        assert [store.queries.item("r1", seq).state.value for seq in (1, 2, 3)] == [
            "in_flight",
            "pending",
            "in_flight",
        ]
        assert [a.finished_at for seq in (1, 3) for a in store.queries.attempts("r1", seq)] == [
            None,
            None,
        ]
    finally:
        store.close()
    assert ws.ledger.receipt_count() == 0


def test_a_worker_that_lost_its_lease_cannot_write(tmp_path: Path) -> None:
    """Once another process took the lease, the old worker's writes are rejected."""
    store = planned_store(tmp_path / "receipts.db", 1)
    dead: Callable[[object, object], bool] = lambda owner, expires: False  # noqa: E731
    old = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, dead)
    new = store.leases.acquire_lease("r1", {"host": "h", "pid": 2}, 30, dead)
    assert new == old + 1
    with pytest.raises(LeaseLost):
        store.ledger.claim("r1", old, 1)
    assert store.queries.item("r1", 1).state.value == "pending"
    assert len(store.ledger.claim("r1", new, 1)) == 1
    store.close()


def _cut_short_checkpoint(ws: Workspace) -> None:
    """Leave the database as a checkpoint cut short leaves it: page 1 (the header) already
    says how many pages the database has after the checkpoint, but the file was not extended
    yet; the pages are still in the -wal beside it, which a killed process left."""
    wal = ws.db_file.with_name(ws.db_file.name + "-wal")
    assert wal.stat().st_size > 0  # the killed process left its commits in the log
    checkpointed = ws.path / "checkpointed"
    checkpointed.mkdir()
    for name in (ws.db_file.name, wal.name):
        (checkpointed / name).write_bytes((ws.path / name).read_bytes())
    conn = sqlite3.connect(checkpointed / ws.db_file.name)
    conn.execute("PRAGMA wal_checkpoint(FULL)")
    conn.close()
    after = (checkpointed / ws.db_file.name).read_bytes()
    page_size = int.from_bytes(after[16:18], "big")
    assert len(after) > ws.db_file.stat().st_size  # the checkpoint grew the file
    with ws.db_file.open("r+b") as handle:
        handle.write(after[:page_size])
    promised = int.from_bytes(after[28:32], "big") * page_size
    assert ws.db_file.stat().st_size < promised


def _pages_in_wal(wal: Path, page_size: int) -> set[int]:
    """The page numbers of every frame in a -wal (a 32-byte header, then frames of a 24-byte
    header, whose first 4 bytes are the page number, and one page)."""
    log = wal.read_bytes()
    frame = 24 + page_size
    return {
        int.from_bytes(log[at : at + 4], "big") for at in range(32, len(log) - frame + 1, frame)
    }


def _damage_an_attempts_leaf_only_the_file_holds(ws: Workspace) -> int:
    """Overwrite the cell area of a leaf page of `attempts` from the middle of its b-tree,
    one no frame of the -wal holds (so the file's copy is the one SQLite reads), with 0xFF:
    a page that quick_check reads and no other check on open does. Its page number."""
    wal = ws.path / "receipts.db-wal"
    probe = ws.path / "probe"
    probe.mkdir()
    for name in (ws.db_file.name, wal.name):
        (probe / name).write_bytes((ws.path / name).read_bytes())
    conn = sqlite3.connect(f"file:{probe / ws.db_file.name}?mode=ro", uri=True)
    try:
        leaves: list[int] = [
            page
            for (page,) in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = 'attempts' AND pagetype = 'leaf' "
                "ORDER BY path"
            )
        ]
    finally:
        conn.close()
    data = ws.db_file.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    logged = _pages_in_wal(wal, page_size)
    inner = [page for page in leaves[1:-1] if page not in logged]
    assert inner, f"no leaf of attempts in the middle of the file only: {leaves}, {logged}"
    page = inner[len(inner) // 2]
    at = (page - 1) * page_size
    assert data[at] == 0x0D, "not a table leaf page"  # the b-tree page header's type byte
    cells = int.from_bytes(data[at + 5 : at + 7], "big") or 65536  # where the cells begin
    with ws.db_file.open("r+b") as handle:
        handle.seek(at + cells)
        handle.write(b"\xff" * (page_size - cells))
    return page


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _commits_between(engine: Engine, commit: Callable[[], None]) -> None:
    """Make `engine` let another process commit an event right after the checks read a
    run's last event number, as a worker sending at that moment would."""
    execute = engine.execute

    def execute_then_commit(statement: str, params: Any = None) -> Any:
        cursor = execute(statement, params)
        if statement == sql.LAST_EVENT:
            commit()
        return cursor

    engine.execute = execute_then_commit  # type: ignore[method-assign]


@pytest.mark.both_stores
def test_a_commit_between_two_checks_is_not_taken_for_a_contradiction(ws: Workspace) -> None:
    """The checks on open read one committed state: a worker committing events between two
    of their queries does not make a healthy database look damaged (it did: 'gaps in its
    event numbers', refusing a second `send` racing the first)."""
    ws.write_csv("batch.csv", make_rows(3))
    assert ws.invoke("send", "batch.csv").exit_code == 0
    store, other = Store.open(ws.db), Store.open(ws.db)
    run_id = store.core.runs()[0].run_id

    def commit() -> None:
        with other.core.write():
            other.core.event(run_id, "note", None, None, clock.now_iso())

    try:
        _commits_between(store.engine, commit)
        store.check_invariants()
    finally:
        store.close()
        other.close()


class _Rows:
    """The rows a claim's SELECT returned, handed back as its cursor would."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


class _MovesOneAfterTheClaimReads:
    """An engine's execute under which, right after a claim has read its pending items and
    before its conditional UPDATE, one of them is moved out of `pending` (as another writer
    moving it between the two statements would leave it). Once only."""

    def __init__(self, engine: Engine, seq: int) -> None:
        self._execute = engine.execute
        self._seq = seq
        self.fired = False

    def __call__(self, statement: str, params: Any = None) -> Any:
        cursor = self._execute(statement, params)
        if self.fired or not (
            statement.startswith("SELECT *") and " FROM items WHERE " in statement
        ):
            return cursor
        self.fired = True
        rows = cursor.fetchall()
        assert self._seq in [row.seq for row in rows]
        self._execute(
            "UPDATE items SET state = 'expired' WHERE run_id = 'r1' AND seq = %(seq)s",
            {"seq": self._seq},
        )
        return _Rows(rows)


def _in_transaction(engine: Engine) -> bool:
    """Whether the engine's connection is inside a transaction, asked of its driver."""
    if isinstance(engine, PostgresEngine):
        return engine.raw.info.transaction_status != TransactionStatus.IDLE
    assert isinstance(engine, SqliteEngine)
    return bool(engine.conn.in_transaction)


def _ledger(ws: Workspace) -> dict[str, list[tuple[Any, ...]]]:
    """Every row a claim could write, read over a connection of its own."""
    return {
        "items": ws.query(
            "SELECT seq, state, attempts, next_attempt_at, worker_id, updated_at FROM items "
            "ORDER BY seq"
        ),
        "attempts": ws.query("SELECT seq, n, started_at FROM attempts ORDER BY seq, n"),
        "events": ws.query("SELECT seq_no, kind, item_seq FROM events ORDER BY seq_no"),
        "run_counts": ws.query("SELECT state, n FROM run_counts ORDER BY state"),
    }


@pytest.mark.both_stores
def test_a_claim_whose_update_moves_fewer_rows_than_it_read_raises_and_writes_nothing(
    ws: Workspace,
) -> None:
    """A claim moving fewer rows than it selected raises LostRace and writes nothing."""
    store = planned_store(ws.db, 3)
    try:
        version = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, lambda o, e: False)
        before = _ledger(ws)
        assert before["items"] and all(row[1] == "pending" for row in before["items"])
        racing = _MovesOneAfterTheClaimReads(store.engine, seq=2)
        store.engine.execute = racing  # type: ignore[method-assign]
        with pytest.raises(LostRace, match="expected 3 items pending for start"):
            store.ledger.claim("r1", version, 3)
        assert racing.fired
        del store.engine.execute  # the engine's own again
        assert not _in_transaction(store.engine)
        assert _ledger(ws) == before
        # The store is still usable: a claim nobody races moves all three.
        assert [i.seq for i in store.ledger.claim("r1", version, 3)] == [1, 2, 3]
    finally:
        store.close()


def _short_file_beside_a_wal_that_does_not_repair_it(ws: Workspace) -> None:
    """A planned run's file cut short by its last two pages (item rows), beside a -wal
    holding a real commit of that database that does not hold those pages."""
    rows = [["id", "to", "subject", "body"]]
    rows += [[f"u{i}", f"u{i}@example.com", "s" * 50, "b" * 1500] for i in range(1, 301)]
    batch = ws.write_csv("big.csv", rows)
    planned = ws.invoke("send", str(batch), "--require-approval")
    assert planned.exit_code == 0, planned.output
    wal = ws.path / "receipts.db-wal"
    assert not wal.exists()  # the last connection checkpointed: one self-contained file
    # A commit that touches page 1 only, made on a copy and kept in its log.
    aside = ws.path / "aside"
    aside.mkdir()
    (aside / "receipts.db").write_bytes(ws.db_file.read_bytes())
    conn = sqlite3.connect(aside / "receipts.db", isolation_level=None)
    try:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("PRAGMA user_version = 7")
        log = (aside / "receipts.db-wal").read_bytes()
    finally:
        conn.close()
    assert log
    data = ws.db_file.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    ws.db_file.write_bytes(data[: len(data) - 2 * page_size])
    wal.write_bytes(log)
    # On a copy of the pair: SQLite reads the log (its commit shows), and the file stays damaged.
    probe = ws.path / "probe"
    probe.mkdir()
    for name in (ws.db_file.name, wal.name):
        (probe / name).write_bytes((ws.path / name).read_bytes())
    conn = sqlite3.connect(f"file:{probe / ws.db_file.name}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (7,)
        try:
            checked = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as exc:
            checked = [str(exc)]
    finally:
        conn.close()
    assert checked != ["ok"], "this -wal repairs the file: the scenario needs one that does not"


def _fingerprint(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "--json"], ["report", "--format", "json"], ["runs"],
     ["resume"], ["send", "other.csv"]],
    ids=" ".join,
)  # fmt: skip
def test_a_short_file_beside_a_wal_that_does_not_repair_it_is_refused_untouched(
    ws: Workspace, args: list[str]
) -> None:
    """A short database whose -wal does not repair it is refused (exit 4), bytes unchanged."""
    _short_file_beside_a_wal_that_does_not_repair_it(ws)
    ws.write_csv("other.csv", make_rows(3))
    wal = ws.path / "receipts.db-wal"
    before = (ws.db_file.read_bytes(), wal.read_bytes())
    try:
        result = ws.invoke(*args)
        assert result.exit_code == 4, result.output
        assert str(ws.db) in result.output and "Traceback" not in result.output
        after = (ws.db_file.read_bytes(), wal.read_bytes() if wal.exists() else None)
        assert _fingerprint(after[0]) == _fingerprint(before[0]), "the database was changed"
        assert after[1] == before[1], "the -wal was changed or removed"
    finally:
        ws.reset()  # a damaged file on purpose: nothing for the counters check to read
