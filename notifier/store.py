"""SQLite store: runs, items, attempts, receipts, events, decisions. All SQL lives here.

The database is the source of truth. Every item or run state change is decided by
state_machine.py and written with a conditional UPDATE (`WHERE state = :expected`); every
write a worker makes is fenced by its lease version, so a worker that lost its lease cannot
write anything.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from . import clock
from .errors import BadInput, NeedsAttention, NotifierError, Refused
from .records import (
    MAYBE_DELIVERED_OUTCOMES,
    Attempt,
    Counts,
    Decision,
    Item,
    Outcome,
    PendingKind,
    Run,
    StoredDraft,
    item_from_row,
    run_from_row,
)
from .schema import APPLICATION_ID, migrations, stored_content_fingerprint
from .state_machine import (
    ACTIVE_ITEM_STATES,
    FINISHED_RUN_STATES,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
    item_next,
    run_next,
)

_ACTIVE = "state IN ({})".format(", ".join(f"'{s.value}'" for s in ACTIVE_ITEM_STATES))
# The states someone has to look at; repeating m004's partial index condition word for word
# lets SQLite use items_attention (it matches a partial index only on the very same terms).
ATTENTION_STATES = (ItemState.IN_FLIGHT, ItemState.UNKNOWN, ItemState.FAILED)
_ATTENTION = "state IN ({})".format(", ".join(f"'{s.value}'" for s in ATTENTION_STATES))
# Events checked for gaps at each end of a run's history when a database is opened.
_EVENT_WINDOW = 10_000
_ITEM_COLUMNS = "seq, item_id, channel, target, payload, idempotency_key, intent_digest, not_after"
_HEADER = b"SQLite format 3\x00"
# Attempt outcomes after which the item may have reached the recipient.
_MAYBE_DELIVERED = "'uncertain', 'interrupted'"


class StoreRefused(Refused):
    """The file is not a database this version may touch; it has not been modified."""


class NoDatabase(BadInput):
    """There is no database yet (a read-only command was run before any send)."""


class DatabaseUnwritable(BadInput):
    """The database (or its directory) cannot be written; nothing was changed."""


class StorageFailed(NeedsAttention):
    """The database could not be written (disk full, I/O error, locked too long). The write
    was rolled back whole; everything committed before it is safe."""


class LostRace(Refused):
    """A conditional UPDATE matched nothing: someone else moved the row first."""


class LeaseLost(Refused):
    """Another process took over the run; this worker must stop without writing."""

    def __str__(self) -> str:
        return f"{super().__str__()}; this process stopped without writing."


class AlreadyPlanned(BadInput):
    """The same content was planned before, as `run` (the newest such run)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        super().__init__(f"already planned as run {run.run_id}")


class RunExists(BadInput):
    """A run with this id is already in the database."""


class LeaseHeld(Refused):
    def __init__(self, owner: dict[str, Any], expires_at: str | None) -> None:
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(
            f"held by pid {owner.get('pid')} on {owner.get('host')} until {clock.local(expires_at)}"
        )


class PlanStage:
    """A plan's intents while the CSV streams in, before anything is stored.

    A private scratch database (SQLite makes it a temporary file, deleted when closed), so
    memory stays flat whatever the size of the batch, and the receipts database is not touched
    until the whole file has passed: a bad last row leaves it exactly as it was (or absent).
    It also holds every item id seen, which finds duplicates without a Python set of a
    million ids. Store.create_run copies its rows in chunks inside its one transaction."""

    CHUNK = 5000

    def __init__(self) -> None:
        self.conn = sqlite3.connect("", isolation_level=None)
        # Scratch: nothing here must survive a crash, so no journal and no fsync.
        self.conn.execute("PRAGMA journal_mode = OFF")
        self.conn.execute("PRAGMA synchronous = OFF")
        self.conn.execute(
            "CREATE TABLE ids (item_id TEXT PRIMARY KEY, line INTEGER NOT NULL) WITHOUT ROWID"
        )
        self.conn.execute(
            "CREATE TABLE items (seq INTEGER PRIMARY KEY, item_id TEXT, channel TEXT, "
            "target TEXT, payload TEXT, idempotency_key TEXT, intent_digest TEXT, not_after TEXT)"
        )
        self.conn.execute("BEGIN")  # one scratch transaction: no commit per chunk
        self._buffer: list[tuple[Any, ...]] = []
        self.count = 0

    def first_use(self, item_id: str, line: int) -> int | None:
        """None the first time `item_id` is seen (it is noted with `line`); after that, the
        line that used it first."""
        cursor = self.conn.execute(
            "INSERT INTO ids (item_id, line) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (item_id, line),
        )
        if cursor.rowcount == 1:
            return None
        (first,) = self.conn.execute(
            "SELECT line FROM ids WHERE item_id = ?", (item_id,)
        ).fetchone()
        return int(first)

    def add(
        self,
        seq: int,
        item_id: str,
        channel: str,
        target: str,
        payload: str,
        key: str,
        digest: str,
        not_after: str | None,
    ) -> None:
        self._buffer.append((seq, item_id, channel, target, payload, key, digest, not_after))
        self.count += 1
        if len(self._buffer) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self.conn.executemany(
                f"INSERT INTO items ({_ITEM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                self._buffer,
            )
            self._buffer.clear()

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Every staged intent in seq order, read a chunk at a time."""
        self._flush()
        cursor = self.conn.execute(f"SELECT {_ITEM_COLUMNS} FROM items ORDER BY seq")
        while chunk := cursor.fetchmany(self.CHUNK):
            yield from chunk

    def close(self) -> None:
        self.conn.close()


class Store:
    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn
        self.db = Database(conn)
        self._indexes: set[str] | None = None  # read once: see _indexed

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: Path, *, create: bool = False, readonly: bool = False) -> Store:
        """Open (or with `create`, make) the database at `path`, refusing any file that is
        not a healthy notifier database of a schema this version knows. Nothing is written
        to a refused file, nor with `readonly`."""
        path = Path(path)
        if not path.exists():
            if not create:
                raise NoDatabase(
                    f"{path}: no database here yet. Run `notifier send BATCH.csv` first, "
                    "or point --db (or NOTIFIER_DB) at an existing receipts database."
                )
            _check_writable(path)
            _create_atomically(path)
        short = _check_file_header(path)
        if not readonly:
            _check_writable(path)
        store = cls._connect(path, fresh=False, readonly=readonly)
        try:
            if short is not None:
                store._check_pages_in_wal(short)
            store._check_schema()
            store.check_invariants()
        except sqlite3.DatabaseError as exc:
            store.close()
            raise StoreRefused(f"{path}: cannot be read as a notifier database ({exc}).") from exc
        except BaseException:
            store.close()
            raise
        if not readonly:
            store._prepare()
        return store

    @classmethod
    def _connect(cls, path: Path, *, fresh: bool, readonly: bool = False) -> Store:
        # isolation_level=None: transactions are begun explicitly (see _write), never
        # implicitly by the sqlite3 module behind our back.
        target, uri = str(path), False
        if readonly:
            # Read-only commands must leave no trace: mode=ro never writes the database. With
            # no -wal beside it no writer is attached and the file is fully checkpointed, so
            # `immutable` reads it without creating -wal/-shm (which mode=ro alone would, and
            # cannot on a read-only file system). With a -wal present, those files exist.
            wal = path.with_name(path.name + "-wal")
            target = f"{path.resolve().as_uri()}?mode=ro"
            target += "" if wal.exists() else "&immutable=1"
            uri = True
        try:
            conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False, uri=uri)
        except sqlite3.OperationalError as exc:
            raise NoDatabase(
                f"{path}: cannot open or create the database ({exc}). Check that the "
                "directory exists and is writable, or choose another --db."
            ) from exc
        # Another process (a cancel, a second resume) may hold the write lock briefly.
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.row_factory = sqlite3.Row
        # Attempts, receipts and decisions must point at items that exist.
        conn.execute("PRAGMA foreign_keys = ON")
        # 64 MiB of page cache: keys are random hashes, so planning a large batch touches
        # index pages all over the file; the default 2 MiB thrashes.
        conn.execute("PRAGMA cache_size = -65536")
        store = cls(path, conn)
        if fresh:
            store._prepare()
        return store

    def _prepare(self) -> None:
        """Pragmas that write to the file, then migrations: only after every check passed."""
        # WAL: readers (status, cancel) never block the worker, and a commit is one append.
        self.conn.execute("PRAGMA journal_mode = WAL")
        # FULL: an intent must survive power loss before its send starts (fsync per commit).
        self.conn.execute("PRAGMA synchronous = FULL")
        # Under the write lock, so two processes opening an older file at once cannot both
        # decide a migration is pending and both apply it.
        with self._write():
            migrations.apply(self.db)

    def secondary(self) -> Store:
        """Another connection to the same checked file, for a thread of our own."""
        store = Store._connect(self.path, fresh=False)
        store.conn.execute("PRAGMA synchronous = FULL")
        return store

    def close(self) -> None:
        self.conn.close()

    def _check_pages_in_wal(self, short: str) -> None:
        """The file is shorter than its header promises, but a write-ahead log sits beside
        it: a checkpoint cut short (a kill, a full disk) leaves exactly this, and SQLite
        recovers the missing pages from the log on open. Refuse only if SQLite itself finds
        the database damaged."""
        rows = [r[0] for r in self.conn.execute("PRAGMA quick_check(5)")]
        if rows != ["ok"]:
            raise StoreRefused(
                f"{self.path}: {short}, and SQLite's quick_check fails even with the "
                f"write-ahead log beside it ({'; '.join(rows)}). Restore it from a backup; "
                "this file was not changed."
            )

    def _check_schema(self) -> None:
        tables = {
            r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        if not tables and app_id == 0:
            return  # an empty SQLite file: ours to initialise
        if app_id != APPLICATION_ID:
            listed = ", ".join(sorted(tables)[:6]) or "none"
            raise StoreRefused(
                f"{self.path}: this SQLite database was not written by notifier (tables: "
                f"{listed}). Point --db at a notifier receipts database or at a new path."
            )
        applied = {m.name for m in migrations.applied(self.db)}
        known = {m.name for m in migrations._migrations}
        newer = sorted(applied - known)
        if newer:
            raise StoreRefused(
                f"{self.path}: written by a newer version of notifier (schema {newer[-1]} is "
                "unknown here). Upgrade notifier; this file was not changed."
            )

    def check_invariants(self) -> None:
        """Refuse a database whose rows contradict each other: resuming on top of it could
        re-send or skip notifications."""
        if not self._has_items():
            return
        problems: list[str] = []
        # Every open pays for these checks, so none walks all the items of a run. With m004,
        # "every sent item has a receipt" is first compared as two counts (each receipt is
        # written with its item's move to sent, and only then), and the items are searched
        # one by one only when the counts disagree.
        if not self._has_table("run_counts") or self._receipts_disagree_with_sent():
            for run_id, seq in self.conn.execute(
                "SELECT i.run_id, i.seq FROM items i WHERE i.state = 'sent' AND NOT EXISTS "
                "(SELECT 1 FROM receipts r WHERE r.idempotency_key = i.idempotency_key) LIMIT 5"
            ):
                problems.append(f"run {run_id} item {seq} is sent but has no receipt")
        for run_id, seq in self.conn.execute(
            f"SELECT i.run_id, i.seq FROM items i {self._indexed('items_attention')} "
            f"WHERE {_ATTENTION} AND i.state = 'in_flight' "
            "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = i.run_id "
            "AND a.seq = i.seq AND a.finished_at IS NULL) LIMIT 5"
        ):
            problems.append(f"run {run_id} item {seq} is in flight but has no open attempt")
        # Driven by the receipts: costs what was sent so far, not the size of the runs.
        for run_id, seq in self.conn.execute(
            "SELECT i.run_id, i.seq FROM receipts r CROSS JOIN items i "
            "ON i.idempotency_key = r.idempotency_key "
            "WHERE i.state = 'sent' AND r.intent_digest != i.intent_digest LIMIT 5"
        ):
            problems.append(f"run {run_id} item {seq} has a receipt for a different digest")
        # Contiguity is checked at the start and the end of each run's events (where a cut
        # or a lost append shows), at most twice _EVENT_WINDOW index entries per run: counting
        # every event of a million-item run on each open would cost more than the rest.
        for (run_id,) in self.conn.execute("SELECT run_id FROM runs"):
            if not self._events_contiguous(run_id):
                problems.append(f"run {run_id} has gaps in its event numbers")
                if len(problems) >= 5:
                    break
        for (run_id,) in self.conn.execute(
            f"SELECT r.run_id FROM runs r WHERE r.state = 'completed' AND EXISTS "
            f"(SELECT 1 FROM items i WHERE i.run_id = r.run_id AND {_ACTIVE}) LIMIT 5"
        ):
            problems.append(f"run {run_id} is completed but still has unfinished items")
        if problems:
            raise StoreRefused(
                f"{self.path}: integrity check failed: {'; '.join(problems)}. The file was not "
                "changed; restore it from a backup or inspect it with sqlite3 before resuming."
            )

    def _events_contiguous(self, run_id: str) -> bool:
        # Two queries: SQLite reads MIN or MAX alone from the index's edge, both at once not.
        (low,) = self.conn.execute(
            "SELECT MIN(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        (high,) = self.conn.execute(
            "SELECT MAX(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        if low is None:
            return True
        if low != 1:
            return False
        window = min(_EVENT_WINDOW, high)
        (head,) = self.conn.execute(
            "SELECT COUNT(*) FROM events WHERE run_id = ? AND seq_no <= ?", (run_id, window)
        ).fetchone()
        (tail,) = self.conn.execute(
            "SELECT COUNT(*) FROM events WHERE run_id = ? AND seq_no > ?",
            (run_id, high - window),
        ).fetchone()
        return bool(head == window and tail == window)

    def _receipts_disagree_with_sent(self) -> bool:
        (receipts,) = self.conn.execute("SELECT COUNT(*) FROM receipts").fetchone()
        (sent,) = self.conn.execute(
            "SELECT COALESCE(SUM(n), 0) FROM run_counts WHERE state = 'sent'"
        ).fetchone()
        return bool(receipts != sent)

    def _indexed(self, index: str) -> str:
        """`INDEXED BY index` when the file has it (a read-only open of a file older than
        m004 does not): without statistics SQLite may prefer a full index of the run over a
        partial one of the few rows asked for."""
        if self._indexes is None:
            self._indexes = {
                r[0]
                for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
            }
        return f"INDEXED BY {index}" if index in self._indexes else ""

    def _has_items(self) -> bool:
        return bool(
            self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='items'"
            ).fetchone()
        )

    # ---------------------------------------------------------------- writing

    @contextmanager
    def _write(self, run_id: str | None = None, lease_version: int | None = None) -> Iterator[None]:
        """One write transaction. IMMEDIATE takes the write lock up front: db.atomic()'s
        deferred BEGIN can fail with SQLITE_BUSY_SNAPSHOT when a concurrent `cancel` commits
        between our read and our write, and busy_timeout cannot retry that. With
        `lease_version`, the transaction is fenced: it aborts if the lease moved on."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise self._storage_failure(exc) from exc
        try:
            if lease_version is not None:
                row = self.conn.execute(
                    "SELECT lease_version FROM runs WHERE run_id = ?", (run_id,)
                ).fetchone()
                if row is None or row[0] != lease_version:
                    raise LeaseLost(f"run {run_id}: another process took over this run")
            yield
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._roll_back()
            raise self._storage_failure(exc) from exc
        except BaseException:
            self._roll_back()
            raise

    def _roll_back(self) -> None:
        if self.conn.in_transaction:
            with suppress(sqlite3.Error):  # a failed disk may refuse even the rollback
                self.conn.execute("ROLLBACK")

    def _storage_failure(self, exc: sqlite3.OperationalError) -> NotifierError:
        """Name what went wrong with the file, the safe state it leaves, and the fix."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        safe = (
            "The write was rolled back whole: every outcome recorded before it is safe, and "
            "anything in flight is settled by query on resume."
        )
        if code == sqlite3.SQLITE_FULL:
            return StorageFailed(
                f"{self.path}: the disk holding {self.path.name} is full. {safe} Free some "
                f"space on that disk, then run `notifier resume`."
            )
        if code == sqlite3.SQLITE_IOERR:
            return StorageFailed(
                f"{self.path}: an I/O error while writing ({exc}). {safe} Check the disk "
                "(dmesg, df), then run `notifier resume`."
            )
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return StorageFailed(
                f"{self.path}: locked by another program for longer than the 10 s busy "
                f"timeout ({exc}). {safe} Find what holds it (e.g. `fuser {self.path}`), "
                "let it finish or stop it, then run the command again."
            )
        if code == sqlite3.SQLITE_READONLY:
            return DatabaseUnwritable(
                f"{self.path}: cannot be written ({exc}). Nothing was changed by this write. "
                "Make the file and its directory writable, then run the command again."
            )
        return StorageFailed(f"{self.path}: the database could not be written ({exc}). {safe}")

    def _event(self, run_id: str, kind: str, item_seq: int | None, detail: Any, at: str) -> None:
        self.conn.execute(
            "INSERT INTO events (run_id, seq_no, at, kind, item_seq, detail) "
            "SELECT ?, COALESCE(MAX(seq_no), 0) + 1, ?, ?, ?, ? FROM events WHERE run_id = ?",
            (run_id, at, kind, item_seq, _dump(detail), run_id),
        )

    def _move_item(
        self, run_id: str, seq: int, current: ItemState, trigger: ItemTrigger, at: str, **sets: Any
    ) -> ItemState:
        target = item_next(trigger, current)
        assignments = "".join(f", {column} = :{column}" for column in sets)
        cursor = self.conn.execute(
            f"UPDATE items SET state = :target, updated_at = :at{assignments} "
            "WHERE run_id = :run_id AND seq = :seq AND state = :current",
            {
                "target": target.value,
                "at": at,
                "run_id": run_id,
                "seq": seq,
                "current": current.value,
                **sets,
            },
        )
        if cursor.rowcount != 1:
            raise LostRace(
                f"run {run_id} item {seq}: another process moved it first (it was no longer "
                f"{current.value} for {trigger}); this process stopped without overwriting "
                f"anything. `notifier status {run_id}` shows where it stands."
            )
        self._event(run_id, trigger, seq, {"from": current.value, "to": target.value}, at)
        return target

    def _move_run(self, run_id: str, trigger: RunTrigger, at: str, **sets: Any) -> RunState:
        current = self.get_run(run_id).state
        target = run_next(trigger, current)
        assignments = "".join(f", {column} = :{column}" for column in sets)
        cursor = self.conn.execute(
            f"UPDATE runs SET state = :target, updated_at = :at{assignments} "
            "WHERE run_id = :run_id AND state = :current",
            {"target": target.value, "at": at, "run_id": run_id, "current": current.value, **sets},
        )
        if cursor.rowcount != 1:
            raise LostRace(
                f"run {run_id}: another process moved it first (it was no longer "
                f"{current.value} for {trigger}); this process stopped without overwriting "
                f"anything. `notifier status {run_id}` shows where it stands."
            )
        self._event(
            run_id, f"run_{trigger}", None, {"from": current.value, "to": target.value, **sets}, at
        )
        return target

    def create_run(
        self,
        run: dict[str, Any],
        items: Sequence[dict[str, Any]] | PlanStage,
        *,
        new_run: bool = False,
        then: RunTrigger | None = None,
    ) -> None:
        """The run row and every intent, in one transaction: a batch is planned whole or not
        at all. `then` (e.g. `request_approval`) moves the new run in the same transaction, so
        no crash can leave a run that needs an approval looking merely `planned`.

        The "already planned" check is part of the same transaction, which holds the write
        lock from its first statement (BEGIN IMMEDIATE): two `send`s of one batch cannot both
        pass the check before either inserts, so exactly one plans it and the other gets
        AlreadyPlanned naming the winner (issue 7, point 5). `new_run` skips the check.
        RunExists: a run with this id is already here.

        `items` is normally the PlanStage the CSV was streamed into: its rows are copied in
        chunks, so a million intents never sit in memory at once."""
        at = run["created_at"]
        with self._write():
            if not new_run:
                same = self._runs_with_content_fingerprint(run["content_fingerprint"])
                if same:
                    raise AlreadyPlanned(same[0])
            if self.conn.execute(
                "SELECT 1 FROM runs WHERE run_id = ?", (run["run_id"],)
            ).fetchone():
                raise RunExists(run["run_id"])
            self.db.table("runs").insert(
                {
                    **run,
                    "channel_snapshot": _dump(run["channel_snapshot"]),
                    "options": _dump(run["options"]),
                    "updated_at": at,
                }
            )
            n = self._insert_items(run["run_id"], items, at)
            self._event(run["run_id"], "planned", None, {"items": n}, at)
            if then is not None:
                self._move_run(run["run_id"], then, at)

    def _insert_items(
        self, run_id: str, items: Sequence[dict[str, Any]] | PlanStage, at: str
    ) -> int:
        """Insert the intents (all `pending`); returns how many. executemany with a fixed
        column list: sqlite-utils' insert_all inspects every value of every row."""
        rows: Iterable[tuple[Any, ...]]
        if isinstance(items, PlanStage):
            rows = items.rows()
        else:
            rows = (
                (
                    item["seq"],
                    item["item_id"],
                    item["channel"],
                    item["target"],
                    _dump(item["payload"]),
                    item["idempotency_key"],
                    item["intent_digest"],
                    item.get("not_after"),
                )
                for item in items
            )
        counted = 0

        def tagged() -> Iterator[tuple[Any, ...]]:
            nonlocal counted
            for row in rows:
                counted += 1
                yield (run_id, *row, at)

        self.conn.executemany(
            f"INSERT INTO items (run_id, {_ITEM_COLUMNS}, state, attempts, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?)",
            tagged(),
        )
        # m004's counters: moves are counted by trigger, inserts here (once, not per row).
        self.conn.execute(
            "INSERT INTO run_counts (run_id, state, n) VALUES (?, 'pending', ?) "
            "ON CONFLICT (run_id, state) DO UPDATE SET n = n + excluded.n",
            (run_id, counted),
        )
        return counted

    def move_run(
        self, run_id: str, trigger: RunTrigger, lease_version: int | None = None, **sets: Any
    ) -> RunState:
        with self._write(run_id, lease_version):
            return self._move_run(run_id, trigger, clock.now_iso(), **sets)

    def expire_due(self, run_id: str, lease_version: int) -> list[int]:
        """Pending items whose deadline has passed become `expired` (never sent), in one
        fenced transaction. An item whose last attempt may have been delivered is left for
        the runner to settle: expiring it would claim "never sent" without knowing."""
        at = clock.now_iso()
        due = self._due_for_expiry(run_id, at)
        if not due:
            return []  # the common case costs one indexed read, no write transaction
        expired: list[int] = []
        with self._write(run_id, lease_version):
            for seq in self._due_for_expiry(run_id, at):
                self._move_item(run_id, seq, ItemState.PENDING, ItemTrigger.EXPIRE, at)
                expired.append(seq)
        return expired

    def _due_for_expiry(self, run_id: str, at: str) -> list[int]:
        return [
            seq
            for (seq,) in self.conn.execute(
                "SELECT i.seq FROM items i WHERE i.run_id = ? AND i.state = 'pending' "
                "AND i.not_after IS NOT NULL AND i.not_after <= ? AND (i.attempts = 0 OR "
                "(SELECT a.outcome FROM attempts a WHERE a.run_id = i.run_id AND a.seq = i.seq "
                f"ORDER BY a.n DESC LIMIT 1) NOT IN ({_MAYBE_DELIVERED})) ORDER BY i.seq",
                (run_id, at),
            )
        ]

    def past_deadline(self, run_id: str, at: str) -> int:
        """How many unfinished items are already past their deadline at `at`."""
        (n,) = self.conn.execute(
            "SELECT COUNT(*) FROM items WHERE run_id = ? AND state = 'pending' "
            "AND not_after IS NOT NULL AND not_after <= ?",
            (run_id, at),
        ).fetchone()
        return int(n)

    def claim(
        self,
        run_id: str,
        lease_version: int,
        limit: int,
        *,
        exclude_channels: Sequence[str] = (),
        exclude_seqs: Sequence[int] = (),
    ) -> list[Item]:
        """Point A for a window: up to `limit` due pending items become in_flight, each with
        an open attempt row, in one transaction. `exclude_seqs`: items the caller still holds
        back (a backoff it times on the monotonic clock)."""
        return self.step(
            run_id,
            lease_version,
            (),
            limit,
            exclude_channels=exclude_channels,
            exclude_seqs=exclude_seqs,
        )

    def record(self, run_id: str, lease_version: int | None, outcomes: Sequence[Outcome]) -> None:
        """Point B for a window: every outcome (receipt, attempt closed, state moved) in one
        transaction."""
        if not outcomes:
            return
        at = clock.now_iso()
        with self._write(run_id, lease_version):
            for outcome in outcomes:
                self._record_one(run_id, outcome, at)

    def step(
        self,
        run_id: str,
        lease_version: int,
        outcomes: Sequence[Outcome],
        claim_limit: int,
        *,
        exclude_channels: Sequence[str] = (),
        exclude_seqs: Sequence[int] = (),
    ) -> list[Item]:
        """One group commit of the pipeline: point B of every finished send in `outcomes`
        and point A of up to `claim_limit` newly claimed items, in one transaction (one
        fsync for all of them). Outcomes are recorded first, so a slot they free can be
        claimed again in the same commit. Returns the claimed items."""
        if not outcomes and claim_limit <= 0:
            return []
        at = clock.now_iso()
        with self._write(run_id, lease_version):
            acks = [o for o in outcomes if _plain_ack(o)]
            for outcome in outcomes:
                if not _plain_ack(outcome):
                    self._record_one(run_id, outcome, at)
            self._record_acks(run_id, acks, at)
            if claim_limit <= 0:
                return []
            return self._claim(run_id, at, claim_limit, exclude_channels, exclude_seqs)

    def _record_acks(self, run_id: str, acks: Sequence[Outcome], at: str) -> None:
        """`_record_one` for many answered sends at once, in four statements instead of four
        per item: with senders on other threads, every statement is one more wait for the
        GIL, and the committer's turn is what a freed slot waits for. Same rows, same
        conditional move (in_flight → sent, all or none)."""
        if not acks:
            return
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(acks))
        params: list[Any] = []
        for o in acks:
            params += [o.seq, o.finished_at or at, o.attempt_outcome, o.http_status, o.error,
                       o.retry_after_s, o.receipt_id, o.receipt_source, o.evidence]  # fmt: skip
        self.conn.execute(
            "UPDATE attempts SET finished_at = v.column2, outcome = v.column3, "
            "http_status = v.column4, error = v.column5, retry_after_s = v.column6 "
            f"FROM (VALUES {values}) AS v WHERE attempts.run_id = ? AND attempts.seq = v.column1 "
            "AND attempts.finished_at IS NULL",
            [*params, run_id],
        )
        self.conn.execute(
            "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, evidence, "
            "recorded_at) SELECT i.idempotency_key, i.intent_digest, v.column7, v.column8, "
            f"v.column9, ? FROM (VALUES {values}) AS v JOIN items AS i "
            "ON i.run_id = ? AND i.seq = v.column1",
            [at, *params, run_id],
        )
        current = ItemState.IN_FLIGHT
        target = item_next(ItemTrigger.ACK, current)
        cursor = self.conn.execute(
            "UPDATE items SET state = ?, updated_at = ?, next_attempt_at = NULL, "
            "last_error = v.column5, receipt_id = v.column7 "
            f"FROM (VALUES {values}) AS v WHERE items.run_id = ? AND items.seq = v.column1 "
            "AND items.state = ?",
            [target.value, at, *params, run_id, current.value],
        )
        if cursor.rowcount != len(acks):
            raise LostRace(f"run {run_id}: expected {len(acks)} items in_flight for ack")
        detail = {"from": current.value, "to": target.value}
        self._events(run_id, "ack", [o.seq for o in acks], detail, at)

    def _events(self, run_id: str, kind: str, seqs: Sequence[int], detail: Any, at: str) -> None:
        """`_event` for several items at once (one statement, consecutive seq_no)."""
        # A bare MAX over the primary key: one seek to the index's edge, not a walk.
        (found,) = self.conn.execute(
            "SELECT MAX(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        last = found or 0
        dumped = _dump(detail)
        params: list[Any] = []
        for i, seq in enumerate(seqs, start=1):
            params += [run_id, last + i, at, kind, seq, dumped]
        self.conn.execute(
            "INSERT INTO events (run_id, seq_no, at, kind, item_seq, detail) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(seqs)),
            params,
        )

    def _claim(
        self,
        run_id: str,
        at: str,
        limit: int,
        exclude_channels: Sequence[str],
        exclude_seqs: Sequence[int],
    ) -> list[Item]:
        where = f"run_id = ? AND {_ACTIVE} AND state = 'pending' "
        where += "AND (next_attempt_at IS NULL OR next_attempt_at <= ?)"
        params: list[Any] = [run_id, at]
        if exclude_channels:
            where += " AND channel NOT IN ({})".format(", ".join("?" * len(exclude_channels)))
            params.extend(exclude_channels)
        if exclude_seqs:
            where += " AND seq NOT IN ({})".format(", ".join("?" * len(exclude_seqs)))
            params.extend(exclude_seqs)
        rows = self.conn.execute(
            f"SELECT * FROM items WHERE {where} ORDER BY seq LIMIT ?", [*params, limit]
        ).fetchall()
        if not rows:
            return []
        items = [item_from_row(row) for row in rows]
        waited: list[float | None] = []
        for item in items:
            last = None
            if item.attempts:
                last = self.conn.execute(
                    "SELECT finished_at FROM attempts WHERE run_id = ? AND seq = ? "
                    "ORDER BY n DESC LIMIT 1",
                    (run_id, item.seq),
                ).fetchone()
            seconds = None
            if last and last[0]:
                seconds = (clock.parse(at) - clock.parse(last[0])).total_seconds()
            waited.append(seconds)
        # The claim as set-based statements (see _record_acks): every row was read pending
        # in this transaction, and the move is still conditional on it.
        current = ItemState.PENDING
        target = item_next(ItemTrigger.START, current)
        seqs = [item.seq for item in items]
        marks = ", ".join("?" * len(seqs))
        cursor = self.conn.execute(
            "UPDATE items SET state = ?, updated_at = ?, attempts = attempts + 1, "
            f"next_attempt_at = NULL WHERE run_id = ? AND seq IN ({marks}) AND state = ?",
            [target.value, at, run_id, *seqs, current.value],
        )
        if cursor.rowcount != len(seqs):
            raise LostRace(f"run {run_id}: expected {len(seqs)} items pending for start")
        self._events(run_id, "start", seqs, {"from": current.value, "to": target.value}, at)
        # n counts attempt rows, not the item's attempts: a released attempt (claimed,
        # never started) keeps its row but is not counted as an attempt.
        values = ", ".join(["(?, ?)"] * len(seqs))
        self.conn.execute(
            "INSERT INTO attempts (run_id, seq, n, started_at, waited_s) "
            "SELECT ?, v.column1, (SELECT COALESCE(MAX(n), 0) + 1 FROM attempts AS a "
            "WHERE a.run_id = ? AND a.seq = v.column1), ?, v.column2 "
            f"FROM (VALUES {values}) AS v",
            [run_id, run_id, at, *[x for pair in zip(seqs, waited, strict=True) for x in pair]],
        )
        return [
            replace(item, state=target, attempts=item.attempts + 1, next_attempt_at=None)
            for item in items
        ]

    def _record_one(self, run_id: str, o: Outcome, at: str) -> None:
        if o.attempt_outcome is not None:
            self.conn.execute(
                "UPDATE attempts SET finished_at = ?, outcome = ?, http_status = ?, error = ?, "
                "retry_after_s = ? WHERE run_id = ? AND seq = ? AND finished_at IS NULL",
                (
                    o.finished_at or at,
                    o.attempt_outcome,
                    o.http_status,
                    o.error,
                    o.retry_after_s,
                    run_id,
                    o.seq,
                ),
            )
        sets: dict[str, Any] = {"next_attempt_at": o.next_attempt_at}
        if o.error is not None or o.trigger in (
            ItemTrigger.ACK,
            ItemTrigger.FOUND,
            ItemTrigger.MARK_SENT,
        ):
            sets["last_error"] = o.error
        if o.receipt_source is not None:
            sets["receipt_id"] = o.receipt_id
            # The receipt carries the digest stored with the intent, copied in SQL.
            self.conn.execute(
                "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, "
                "evidence, recorded_at) SELECT idempotency_key, intent_digest, ?, ?, ?, ? "
                "FROM items WHERE run_id = ? AND seq = ?",
                (o.receipt_id, o.receipt_source, o.evidence, at, run_id, o.seq),
            )
        if o.trigger == ItemTrigger.RELEASE:
            # Claimed but never started: it does not count as an attempt (the move below is
            # conditional on in_flight, so a lost race rolls this back too).
            self.conn.execute(
                "UPDATE items SET attempts = attempts - 1 WHERE run_id = ? AND seq = ? "
                "AND state = 'in_flight' AND attempts > 0",
                (run_id, o.seq),
            )
        current = o.expected
        if current is None:
            (state,) = self.conn.execute(
                "SELECT state FROM items WHERE run_id = ? AND seq = ?", (run_id, o.seq)
            ).fetchone()
            current = ItemState(state)
        self._move_item(run_id, o.seq, current, o.trigger, at, **sets)

    def decide(
        self,
        run_id: str,
        seq: int,
        trigger: ItemTrigger,
        operator: str,
        evidence: str,
        lease_version: int,
    ) -> None:
        """A manual reconcile decision: the move, its audit row and, for `mark_sent`, a
        receipt whose source is `manual` — all in one transaction."""
        at = clock.now_iso()
        with self._write(run_id, lease_version):
            self.conn.execute(
                "INSERT INTO decisions (run_id, seq, operator, at, decision, evidence) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, seq, operator, at, trigger, evidence),
            )
            self._event(
                run_id,
                "decision",
                seq,
                {"decision": trigger, "operator": operator, "evidence": evidence},
                at,
            )
            source = "manual" if trigger == ItemTrigger.MARK_SENT else None
            self._record_one(
                run_id, Outcome(seq, trigger, receipt_source=source, evidence=evidence), at
            )

    # ------------------------------------------------------------ drafts (--compose)

    def create_drafting_run(
        self, run: dict[str, Any], sources: Sequence[tuple[int, int, str]]
    ) -> None:
        """The run row (fingerprint empty: not frozen yet) and one pending draft per row
        (seq, line, source), in one transaction."""
        at = run["created_at"]
        with self._write():
            self.db.table("runs").insert(
                {
                    **run,
                    "fingerprint": "",
                    "channel_snapshot": _dump(run["channel_snapshot"]),
                    "options": _dump(run["options"]),
                    "updated_at": at,
                }
            )
            self.conn.executemany(
                "INSERT INTO drafts (run_id, seq, line, source, state) "
                "VALUES (?, ?, ?, ?, 'pending')",
                ((run["run_id"], seq, line, source) for seq, line, source in sources),
            )
            self._event(run["run_id"], "planned", None, {"drafts": len(sources)}, at)

    def pending_drafts(self, run_id: str) -> list[tuple[int, str]]:
        return [
            (seq, source)
            for seq, source in self.conn.execute(
                "SELECT seq, source FROM drafts WHERE run_id = ? AND state = 'pending' "
                "ORDER BY seq",
                (run_id,),
            )
        ]

    def save_draft(self, run_id: str, seq: int, draft: dict[str, Any]) -> None:
        """A draft, durable before any digest is computed from it; only ever once per row."""
        at = clock.now_iso()
        with self._write():
            cursor = self.conn.execute(
                "UPDATE drafts SET state = 'drafted', subject = ?, body = ?, model = ?, "
                "input_tokens = ?, output_tokens = ?, error = NULL, drafted_at = ? "
                "WHERE run_id = ? AND seq = ? AND state = 'pending'",
                (
                    draft["subject"],
                    draft["body"],
                    draft["model"],
                    draft["input_tokens"],
                    draft["output_tokens"],
                    at,
                    run_id,
                    seq,
                ),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} row {seq}: already drafted")
            self._event(run_id, "drafted", seq, {"model": draft["model"]}, at)

    def fail_draft(self, run_id: str, seq: int, error: str, expected: str = "pending") -> None:
        at = clock.now_iso()
        with self._write():
            cursor = self.conn.execute(
                "UPDATE drafts SET state = 'failed', error = ?, drafted_at = ? "
                "WHERE run_id = ? AND seq = ? AND state = ?",
                (error, at, run_id, seq, expected),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} row {seq}: expected draft {expected}")
            self._event(run_id, "draft_failed", seq, {"error": error}, at)

    def drafts(self, run_id: str) -> list[StoredDraft]:
        return [
            StoredDraft(*tuple(r))
            for r in self.conn.execute(
                "SELECT seq, line, source, state, subject, body, model, input_tokens, "
                "output_tokens, error FROM drafts WHERE run_id = ? ORDER BY seq",
                (run_id,),
            )
        ]

    def draft_summary(self, run_id: str) -> dict[str, int]:
        summary = {"total": 0, "drafted": 0, "failed": 0, "pending": 0}
        for state, n in self.conn.execute(
            "SELECT state, COUNT(*) FROM drafts WHERE run_id = ? GROUP BY state", (run_id,)
        ):
            summary[state] = n
            summary["total"] += n
        tokens = self.conn.execute(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) "
            "FROM drafts WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        summary["input_tokens"], summary["output_tokens"] = int(tokens[0]), int(tokens[1])
        return summary

    def draft_failures(self, run_id: str) -> list[tuple[int, int, str]]:
        """(seq, line, error) of every row whose draft failed."""
        return [
            (seq, line, error)
            for seq, line, error in self.conn.execute(
                "SELECT seq, line, error FROM drafts WHERE run_id = ? AND state = 'failed' "
                "ORDER BY seq",
                (run_id,),
            )
        ]

    def freeze_plan(
        self,
        run_id: str,
        fingerprint: str,
        content_fingerprint: str,
        items: Sequence[dict[str, Any]] | PlanStage,
        then: RunTrigger | None = None,
    ) -> None:
        """The intents computed from the stored drafts and the run's fingerprint, in one
        transaction, and only once: a run already frozen is never planned again."""
        at = clock.now_iso()
        with self._write():
            cursor = self.conn.execute(
                "UPDATE runs SET fingerprint = ?, content_fingerprint = ?, updated_at = ? "
                "WHERE run_id = ? AND fingerprint = '' AND state = 'planned'",
                (fingerprint, content_fingerprint, at, run_id),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id}: its plan was already frozen")
            n = self._insert_items(run_id, items, at)
            self._event(run_id, "frozen", None, {"items": n}, at)
            if then is not None:
                self._move_run(run_id, then, at)

    def record_approval(self, run_id: str, approval: dict[str, Any], state_version: int) -> None:
        """Bind an approval, only if the run has not changed since it was reviewed at
        `state_version` (its last event number): otherwise LostRace, nothing written. A run
        awaiting approval moves to `approved`; a run already past that gets a fresh record."""
        at = clock.now_iso()
        with self._write():
            if self.state_version(run_id) != state_version:
                raise LostRace(f"run {run_id} changed while it was being approved")
            run = self.get_run(run_id)
            if run.state is RunState.AWAITING_APPROVAL:
                self._move_run(run_id, RunTrigger.APPROVE, at, approval=_dump(approval))
                return
            cursor = self.conn.execute(
                "UPDATE runs SET approval = ?, updated_at = ? WHERE run_id = ? AND state = ?",
                (_dump(approval), at, run_id, run.state.value),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} changed while it was being approved")
            self._event(run_id, "approval_renewed", None, approval, at)

    def state_version(self, run_id: str) -> int:
        """The run's state version: the number of its last event. Every state move and
        every item outcome appends one, so an approval bound to it names one exact state."""
        row = self.conn.execute(
            "SELECT MAX(seq_no) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        return int(row[0] or 0)

    def request_cancel(self, run_id: str) -> bool:
        """Flag the run for cancel; False (nothing written) when it already finished, e.g. a
        worker completed it between the caller's read and this write."""
        at = clock.now_iso()
        finished = ", ".join(f"'{s.value}'" for s in FINISHED_RUN_STATES)
        with self._write():
            cursor = self.conn.execute(
                "UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, ?), "
                f"updated_at = ? WHERE run_id = ? AND state NOT IN ({finished})",
                (at, at, run_id),
            )
            if cursor.rowcount != 1:
                return False
            self._event(run_id, "cancel_requested", None, None, at)
        return True

    # ---------------------------------------------------------------- leases

    def acquire_lease(
        self, run_id: str, owner: dict[str, Any], ttl_s: float, holder_alive: Any
    ) -> int:
        """Take the run for `owner` unless a live holder has it; returns the new fencing
        version. `holder_alive(owner, expires_at)` decides liveness (lease.py)."""
        at = clock.now()
        with self._write():
            run = self.get_run(run_id)
            if run.lease_owner and holder_alive(run.lease_owner, run.lease_expires_at):
                raise LeaseHeld(run.lease_owner, run.lease_expires_at)
            version = run.lease_version + 1
            self.conn.execute(
                "UPDATE runs SET lease_owner = ?, lease_version = ?, lease_expires_at = ? "
                "WHERE run_id = ? AND lease_version = ?",
                (
                    _dump(owner),
                    version,
                    clock.iso(clock.later(ttl_s, at)),
                    run_id,
                    run.lease_version,
                ),
            )
            self._event(
                run_id,
                "lease_taken",
                None,
                {"owner": owner, "version": version, "previous": run.lease_owner},
                clock.iso(at),
            )
        return version

    def renew_lease(self, run_id: str, lease_version: int, ttl_s: float) -> bool:
        with self._write():
            cursor = self.conn.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_version = ?",
                (clock.iso(clock.later(ttl_s)), run_id, lease_version),
            )
        return cursor.rowcount == 1

    def release_lease(self, run_id: str, lease_version: int) -> None:
        with self._write():
            self.conn.execute(
                "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE run_id = ? AND lease_version = ?",
                (run_id, lease_version),
            )

    # ---------------------------------------------------------------- reading

    def get_run(self, run_id: str) -> Run:
        row = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(run_id)
        return run_from_row(row)

    def runs(self) -> list[Run]:
        rows = self.conn.execute("SELECT * FROM runs ORDER BY created_at DESC, rowid DESC")
        return [run_from_row(r) for r in rows]

    def newest_run(self, exclude: Sequence[RunState] = ()) -> Run | None:
        for run in self.runs():
            if run.state not in exclude:
                return run
        return None

    def runs_with_fingerprint(self, fingerprint: str) -> list[Run]:
        """Runs with this approval fingerprint (content + channel definitions), newest first."""
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE fingerprint = ? ORDER BY created_at DESC, rowid DESC",
            (fingerprint,),
        )
        return [run_from_row(r) for r in rows]

    def runs_with_content_fingerprint(self, content_fingerprint: str) -> list[Run]:
        """Runs that planned the same content (digests + channel names), newest first. For
        display only (`--dry-run`): the decision is taken inside create_run."""
        return self._runs_with_content_fingerprint(content_fingerprint)

    def _runs_with_content_fingerprint(self, content_fingerprint: str) -> list[Run]:
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}
        if "content_fingerprint" not in columns:
            # Opened read-only before m002 was applied: compute what m002 would store.
            return [
                run
                for run in self.runs()
                if stored_content_fingerprint(self.conn, run.run_id) == content_fingerprint
            ]
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE content_fingerprint = ? ORDER BY created_at DESC, rowid DESC",
            (content_fingerprint,),
        )
        return [run_from_row(r) for r in rows]

    def run_flags(self, run_id: str) -> tuple[str | None, int]:
        """The two things a worker polls between windows: cancel request and lease version."""
        row = self.conn.execute(
            "SELECT cancel_requested_at, lease_version FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return row[0], row[1]

    def counts(self, run_id: str) -> Counts:
        """Items per state, from the counters m004's triggers keep with every move: one
        indexed read of at most one row per state, whatever the size of the run."""
        if self._has_table("run_counts"):
            sql = "SELECT state, n FROM run_counts WHERE run_id = ?"
        else:  # opened read-only before m004 was applied: count the rows
            sql = "SELECT state, COUNT(*) FROM items WHERE run_id = ? GROUP BY state"
        return Counts.of(dict(self.conn.execute(sql, (run_id,)).fetchall()))

    def _has_table(self, name: str) -> bool:
        return bool(
            self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
        )

    def items(self, run_id: str, states: Sequence[ItemState] | None = None) -> Iterator[Item]:
        if states is None:
            cursor = self.conn.execute(
                "SELECT * FROM items WHERE run_id = ? ORDER BY seq", (run_id,)
            )
        else:
            marks = ", ".join("?" * len(states))
            # Repeating a partial index's own condition lets SQLite use it: the attention
            # index for in_flight/unknown/failed (never a walk over a million pending items),
            # else the active one.
            indexed = ""
            if all(s in ATTENTION_STATES for s in states):
                active, indexed = _ATTENTION, self._indexed("items_attention")
            elif _all_active(states):
                active = _ACTIVE
            else:
                active = "1"
            cursor = self.conn.execute(
                f"SELECT * FROM items {indexed} WHERE run_id = ? AND {active} "
                f"AND state IN ({marks}) "
                "ORDER BY seq",
                (run_id, *[s.value for s in states]),
            )
        for row in cursor:
            yield item_from_row(row)

    def items_with_receipts(self, run_id: str) -> Iterator[tuple[Item, str | None, str | None]]:
        """Every item in seq order with its receipt's source and evidence (None without one),
        read as the caller goes: the full report streams from this cursor."""
        cursor = self.conn.execute(
            "SELECT i.*, r.source AS receipt_source, r.evidence AS receipt_evidence "
            "FROM items i LEFT JOIN receipts r ON r.idempotency_key = i.idempotency_key "
            "WHERE i.run_id = ? ORDER BY i.seq",
            (run_id,),
        )
        for row in cursor:
            yield item_from_row(row), row["receipt_source"], row["receipt_evidence"]

    def item(self, run_id: str, seq: int) -> Item:
        row = self.conn.execute(
            "SELECT * FROM items WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()
        if row is None:
            raise KeyError(seq)
        return item_from_row(row)

    def item_by_id(self, run_id: str, item_id: str) -> Item | None:
        row = self.conn.execute(
            "SELECT * FROM items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
        ).fetchone()
        return item_from_row(row) if row else None

    def throttled_until(self, run_id: str) -> dict[str, str]:
        """Per channel, the latest time a downstream asked us to stay away, so a new process
        honours a Retry-After that an earlier one was given: a pending item whose last attempt
        was throttled waits until its next_attempt_at, and any throttled attempt (also one
        that ended its item) asked the channel to wait retry_after_s from its answer."""
        until: dict[str, str] = {}

        def later(channel: str, moment: str) -> None:
            if moment > until.get(channel, ""):
                until[channel] = moment

        # items_waiting and attempts_throttled (m004): only the waiting and throttled rows.
        for channel, moment in self.conn.execute(
            "SELECT i.channel, MAX(i.next_attempt_at) FROM items i "
            "WHERE i.run_id = ? AND i.state = 'pending' "
            "AND i.next_attempt_at IS NOT NULL AND (SELECT a.outcome FROM attempts a "
            "WHERE a.run_id = i.run_id AND a.seq = i.seq ORDER BY a.n DESC LIMIT 1) "
            "= 'throttled' GROUP BY i.channel",
            (run_id,),
        ):
            later(channel, moment)
        for channel, finished_at, wait_s in self.conn.execute(
            "SELECT i.channel, a.finished_at, a.retry_after_s FROM attempts a "
            "JOIN items i ON i.run_id = a.run_id AND i.seq = a.seq "
            "WHERE a.run_id = ? AND a.outcome = 'throttled' AND a.finished_at IS NOT NULL "
            "AND a.retry_after_s IS NOT NULL ORDER BY a.run_id, a.seq",
            (run_id,),
        ):
            later(channel, clock.iso(clock.later(wait_s, clock.parse(finished_at))))
        return until

    def pending_kinds(self, run_id: str) -> dict[int, PendingKind]:
        """seq → kind for every pending item that was attempted (the others were never
        attempted). An attempt whose outcome was uncertain (timeout, 5xx, 409 in progress,
        a stop mid-request) may have been delivered unless a later query (`not_found`) or an
        operator (`mark_not_sent`) proved otherwise; a throttled or refused one was not."""
        maybe = ", ".join(f"'{o}'" for o in MAYBE_DELIVERED_OUTCOMES)
        # Through m004's items_retried and events_disproof: only the retried items, and only
        # the disproving events of each, are read (never every pending item or every event).
        rows = self.conn.execute(
            "SELECT i.seq, EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = i.run_id "
            f"AND a.seq = i.seq AND a.outcome IN ({maybe}) AND NOT EXISTS (SELECT 1 FROM "
            "events e WHERE e.run_id = i.run_id AND e.item_seq = i.seq "
            "AND e.kind IN ('not_found', 'mark_not_sent') AND e.at >= a.finished_at)) "
            "FROM items i WHERE i.run_id = ? AND i.state = 'pending' AND i.attempts > 0",
            (run_id,),
        )
        return {
            seq: PendingKind.MAYBE_DELIVERED if maybe_delivered else PendingKind.RETRY_WAITING
            for seq, maybe_delivered in rows
        }

    def pending_by_channel(self, run_id: str) -> list[tuple[str, str | None]]:
        """Per channel with pending items: the earliest next_attempt_at (None: due now)."""
        indexed = self._indexed("items_pending_channel")
        if not indexed:  # a file older than m004, opened read-only
            return [
                (channel, earliest or None)
                for channel, earliest in self.conn.execute(
                    f"SELECT channel, MIN(COALESCE(next_attempt_at, '')) FROM items "
                    f"WHERE run_id = ? AND {_ACTIVE} AND state = 'pending' GROUP BY channel",
                    (run_id,),
                )
            ]
        # One index probe per channel of the run (NULL, due now, sorts first), never a walk
        # over its pending items.
        found = []
        for channel in sorted(self.get_run(run_id).channel_snapshot):
            row = self.conn.execute(
                f"SELECT next_attempt_at FROM items {indexed} WHERE run_id = ? "
                "AND state = 'pending' AND channel = ? ORDER BY next_attempt_at LIMIT 1",
                (run_id, channel),
            ).fetchone()
            if row is not None:
                found.append((channel, row[0] or None))
        return found

    def waiting_for_query(self, run_id: str, due_by: str | None = None) -> list[Item]:
        """Unknown items that wait for their channel's query_delay before a 404 may count
        (next_attempt_at = when to ask again); with `due_by`, only those due by then."""
        # items_attention (m004) holds the unknown items: never a walk over the pending ones.
        sql = (
            f"SELECT * FROM items {self._indexed('items_attention')} WHERE run_id = ? "
            f"AND {_ATTENTION} AND state = 'unknown' AND next_attempt_at IS NOT NULL"
        )
        params: list[Any] = [run_id]
        if due_by is not None:
            sql += " AND next_attempt_at <= ?"
            params.append(due_by)
        return [item_from_row(r) for r in self.conn.execute(sql + " ORDER BY seq", params)]

    def attempts(self, run_id: str, seq: int | None = None) -> list[Attempt]:
        sql = (
            "SELECT seq, n, started_at, finished_at, outcome, http_status, error, waited_s, "
            "retry_after_s FROM attempts WHERE run_id = ?"
        )
        params: list[Any] = [run_id]
        if seq is not None:
            sql += " AND seq = ?"
            params.append(seq)
        return [Attempt(*tuple(r)) for r in self.conn.execute(sql + " ORDER BY id", params)]

    def decisions(self, run_id: str) -> list[Decision]:
        return [
            Decision(*tuple(r))
            for r in self.conn.execute(
                "SELECT d.seq, i.item_id, d.operator, d.at, d.decision, d.evidence "
                "FROM decisions d JOIN items i ON i.run_id = d.run_id AND i.seq = d.seq "
                "WHERE d.run_id = ? ORDER BY d.id",
                (run_id,),
            )
        ]


def _check_file_header(path: Path) -> str | None:
    """Cheap checks on the raw bytes, before SQLite opens the file (and before anything could
    write to it): the magic string, and that no page the header promises is missing.

    Returns a description of the shortfall when the file is shorter than its header says
    but a write-ahead log is present: that is a normal state after a cut-short checkpoint
    (the pages are in the log), so the caller lets SQLite decide with a quick_check."""
    size = path.stat().st_size
    if size == 0:
        raise StoreRefused(
            f"{path}: the file is empty (0 bytes), so it holds no receipts. If it was meant "
            "to, restore it from a backup; for a fresh start delete it or choose another --db."
        )
    with path.open("rb") as handle:
        header = handle.read(100)
    if not header.startswith(_HEADER):
        raise StoreRefused(
            f"{path}: not an SQLite database (it does not start with the SQLite header). "
            "Point --db at a notifier receipts database."
        )
    if len(header) < 100:
        raise StoreRefused(f"{path}: truncated: the 100-byte SQLite header is incomplete.")
    (page_size,) = struct.unpack(">H", header[16:18])
    page_size = 65536 if page_size == 1 else page_size
    change_counter, pages = struct.unpack(">II", header[24:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    if valid_for != change_counter or size >= pages * page_size:
        return None
    short = (
        f"the header promises {pages} pages of {page_size} bytes ({pages * page_size} bytes) "
        f"but the file has {size}"
    )
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return short
    raise StoreRefused(
        f"{path}: truncated: {short}. Restore it from a backup; this file was not changed."
    )


def _create_atomically(path: Path) -> None:
    """Make a new, fully initialised database at `path`, unless another process got there
    first. It is built under a temporary name and linked into place in one step: a process
    racing us never sees a half-made (0-byte) file, which would rightly be refused."""
    temporary = path.with_name(f".{path.name}.creating-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        store = Store._connect(temporary, fresh=True)
        store.close()  # the last connection checkpoints the log: one self-contained file
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process won the race: use its database
        except OSError:
            # A file system without hard links: a rename cannot refuse to overwrite, so
            # check first (a race here needs two first-ever sends on such a disk at once).
            if not path.exists():
                os.replace(temporary, path)
    finally:
        for leftover in ("", "-wal", "-shm"):
            with suppress(FileNotFoundError):
                os.unlink(f"{temporary}{leftover}")


def _check_writable(path: Path) -> None:
    """A database we are about to write must be writable, and so must its directory (SQLite
    creates the -wal and -shm files there). access(2) also reports a read-only mount."""
    directory = path.parent if str(path.parent) else Path(".")
    if path.exists() and not os.access(path, os.W_OK):
        why = "the file is read-only"
    elif not os.access(directory, os.W_OK | os.X_OK):
        why = f"its directory {directory} is not writable"
    else:
        return
    raise DatabaseUnwritable(
        f"{path}: cannot be written: {why}. Nothing was changed. `notifier status`, `report` "
        "and `runs` still read it; to send, resume, cancel or reconcile, make it writable "
        "(or copy it somewhere writable and pass --db)."
    )


def _dump(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _all_active(states: Sequence[ItemState]) -> bool:
    return all(s in ACTIVE_ITEM_STATES for s in states)


def _plain_ack(o: Outcome) -> bool:
    """An answered send as the pipeline records it: batched by Store._record_acks."""
    return (
        o.trigger == ItemTrigger.ACK
        and o.expected is ItemState.IN_FLIGHT
        and o.receipt_source is not None
        and o.attempt_outcome is not None
    )
