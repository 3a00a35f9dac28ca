"""The SQLite engine (backend.py): one receipts database in one file, opened and checked
before anything is written to it, written by one process at a time (BEGIN IMMEDIATE)."""

from __future__ import annotations

import functools
import os
import re
import secrets
import sqlite3
import struct
import sys
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, NamedTuple, Self

from notifier.domain.chain import UNKEYED, Signer
from notifier.domain.errors import NextStep, NotifierError
from notifier.store import chaining, migrations, statements
from notifier.store.backend import (
    Dialect,
    Fence,
    Rows,
    closed_if_failed,
    unwritten_text,
    written,
)
from notifier.store.checks import Checks, refuse_newer
from notifier.store.core import ROLLED_BACK
from notifier.store.exceptions import (
    DatabaseDamaged,
    DatabaseUnwritable,
    NoDatabase,
    ReadRaced,
    StorageFailed,
    StoreRefused,
)
from notifier.store.stage import _PENDING_COLUMNS, PlanStage

_HEADER = b"SQLite format 3\x00"

# The engine's own statements (the notation of statements/), used on SQLite only.
_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
_HAS_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %(name)s"
_INDEXES = "SELECT name FROM sqlite_master WHERE type = 'index'"
# The transaction's events, numbered and linked at COMMIT (chaining.py), bound as they come.
_INSERT_EVENTS = f"INSERT INTO events ({chaining.COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
# sqlite3's positional form: rows of a plan are bound as they come, without a mapping each.
_INSERT_PENDING = (
    f"INSERT INTO items ({_PENDING_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0)"
)

SQLITE = Dialect(
    name="sqlite",
    storage_errors=(sqlite3.OperationalError,),
    lost_errors=(),  # a file: a failed read says what it met (damaged, raced, unreadable)
    ordered_join="CROSS JOIN",  # SQLite's planner otherwise starts from items
    claim_lock="",  # BEGIN IMMEDIATE holds the whole file: one writer at a time
    row_lock="",
    share_lock="",
    reap_lock="",
    begin_snapshot="BEGIN",  # the WAL snapshot is taken by the transaction's first read
    now_s="((julianday('now') - 2440587.5) * 86400.0)",
    least="MIN",
    # suppression.address_key on a stored target, as far as SQL can compute it alike on both
    # engines: trimmed, ASCII letters lower-cased (SQLite's LOWER does only ASCII). Non-ASCII
    # capitals are left to the claim's check, which computes the key in Python.
    address_of="LOWER(TRIM({}))",
    writing_ctes=False,
    shares_runs=False,
)


# sqlite3 decodes each text cell as it is fetched, and raises this (with no SQLite error
# code, the library's own message) for bytes that are not UTF-8. notifier writes only UTF-8
# text, so such a cell is a damaged file, never a failed write or a bug.
_UNDECODABLE = re.compile(r"^Could not decode to UTF-8 column '(?P<column>[^']*)'")


def undecodable_text(exc: BaseException, path: Path | str) -> DatabaseDamaged | None:
    """`exc` as the damaged file it shows, when it is sqlite3's refusal to decode a text
    cell read from `path`; None for anything else."""
    if not isinstance(exc, sqlite3.OperationalError):
        return None
    found = _UNDECODABLE.match(str(exc))
    if found is None:
        return None
    return DatabaseDamaged(
        f"{path}: its column {found['column']!r} holds text that is not UTF-8, which notifier "
        "never writes: the file was damaged on disk or changed outside notifier. Nothing was "
        "changed by this command."
    ).advise(NextStep.VERIFY)


class SqliteEngine:
    """Opening an SQLite file and the checks that come first: nothing is written to a file
    that fails them, and read-only commands open it read-only. Then the engine's part of
    every transaction (engine.Engine)."""

    dialect = SQLITE

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn: Any = conn
        self._indexes: set[str] | None = None  # read once: see has_index
        # The catalogue's statements, in sqlite3's named style.
        self._compiled = statements.Compiled(self._compile)
        self._stage_attached = False  # a plan's stage attached by stage_table
        self.signer: Signer = UNKEYED  # links the events (chain.py); Store.open sets it
        self._due = chaining.DueEvents()  # the open transaction's events, linked at COMMIT
        # A connection that reads the file `immutable` (see _connect): the file's state
        # when it was opened, compared again as it closes (close). None otherwise.
        self._unlocked_since: _FileState | None = None
        # The file this connection has open, as commit compares it with the path's.
        self._opened_file = _identity(path)

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(
        cls, path: Path | str, *, create: bool = False, readonly: bool = False,
        audited: bool = False,
    ) -> Self:  # fmt: skip
        """Open (or with `create`, make) the database at `path`, refusing any file that is
        not a healthy notifier database of a schema this version knows. Nothing is written
        to a refused file, nor with `readonly`. `audited` (with `readonly`): rows that
        contradict each other are not refused, since `verify` is there to name them."""
        path = Path(path)
        if not path.exists():
            if not create:
                raise NoDatabase(f"{path}: no database here yet.").advise(NextStep.SEND_FIRST)
            _check_writable(path)
            _create_atomically(path, lambda p: cls._connect(p, fresh=True))
        if not readonly:
            _check_writable(path)
        try:
            return cls._opened(path, readonly=readonly, audited=audited)
        except (sqlite3.OperationalError, StorageFailed) as exc:
            # Met by the open itself, or by a write of its own (its migrations, raised as a
            # StorageFailed from the driver's error): the command did nothing yet, so it is
            # the command that runs again, never a resume.
            cause = exc if isinstance(exc, sqlite3.OperationalError) else exc.__cause__
            if isinstance(cause, sqlite3.OperationalError) and _locked(cause):
                raise _locked_at_open(path, cause) from cause
            if isinstance(cause, sqlite3.OperationalError) and _disk_failed(cause):
                raise _unopenable(path, cause) from cause
            raise

    @classmethod
    def _opened(cls, path: Path, *, readonly: bool, audited: bool) -> Self:
        """The checked file opened (open's second half): SQLite's errors as they come."""
        # The checks run on a read-only connection, also for a command that goes on to
        # write: SQLite may write through a read-write connection as it closes (the last one
        # checkpoints the -wal into the file and deletes the -wal), which a refused file must
        # never see. Only a file that passed is then opened read-write.
        checked = cls._checked(path, invariants=not (readonly and audited))
        if readonly:
            if audited:
                # `verify` names text no notifier wrote (not UTF-8), rather than fail on it.
                checked.conn.text_factory = unwritten_text
            return checked
        checked._release()  # the checks' own reads: this command goes on to write
        engine = cls._connect(path, fresh=False)
        with closed_if_failed(engine):
            engine._prepare()
        return engine

    @classmethod
    def _checked(cls, path: Path, *, invariants: bool = True) -> Self:
        """A read-only connection to `path` that passed every check, or StoreRefused.

        Without a -wal the file is read `immutable` (see _connect), without SQLite's locks:
        another process that opened it meanwhile may checkpoint into it under our reads. So
        a refusal stands only if the file is as it was before the checks (same inode, size,
        mtime and -wal or none); if it changed meanwhile they run again, up to 3 times."""
        attempt = 0
        while True:
            attempt += 1
            before = _file_state(path)
            short = _check_file_header(path)
            engine = cls._connect(path, fresh=False, readonly=True)
            try:
                if short is not None:
                    engine._check_pages_in_wal(short)
                engine._check_schema()
                if invariants:
                    Checks(engine).check_invariants()
            except sqlite3.DatabaseError as exc:
                engine._release()
                if _locked(exc) or _disk_failed(exc):
                    raise  # another program's lock, a full disk: nothing about the file's health
                refusal = StoreRefused(
                    f"{path}: cannot be read as a notifier database ({exc}); this file was "
                    f"not changed. Inspect it with `sqlite3 -readonly {path} 'PRAGMA "
                    "integrity_check'` and restore it from a backup if it is damaged."
                )
                refusal.__cause__ = exc
            except StoreRefused as exc:
                engine._release()
                refusal = exc
            except BaseException:
                engine._release()
                raise
            else:
                return engine
            if attempt == 3 or _file_state(path) == before:
                raise refusal

    @classmethod
    def _connect(cls, path: Path, *, fresh: bool, readonly: bool = False) -> Self:
        # isolation_level=None: transactions are begun explicitly (see core.Core.write), never
        # implicitly by the sqlite3 module behind our back.
        target, uri = str(path), False
        unlocked_since: _FileState | None = None
        if readonly:
            # The checks, and read-only commands, leave no trace: mode=ro never writes the
            # database. With no -wal beside it no writer is attached and the file is fully
            # checkpointed, so `immutable` reads it without creating -wal/-shm (which mode=ro
            # alone would, and cannot on a read-only file system). With a -wal present,
            # those files exist. The file's state is taken before SQLite opens it: a
            # process that opens it from then on changes it (close compares).
            state = _file_state(path)
            target = f"{path.resolve().as_uri()}?mode=ro"
            target += "" if state.wal else "&immutable=1"
            unlocked_since = None if state.wal else state
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
        conn.row_factory = _named_row
        # Attempts, receipts and decisions must point at items that exist.
        conn.execute("PRAGMA foreign_keys = ON")
        # 64 MiB of page cache: keys are random hashes, so planning a large batch touches
        # index pages all over the file; the default 2 MiB thrashes.
        conn.execute("PRAGMA cache_size = -65536")
        engine = cls(path, conn)
        engine._unlocked_since = unlocked_since
        if fresh:
            engine._prepare()
        return engine

    def _prepare(self) -> None:
        """Pragmas that write to the file, then migrations: only after every check passed."""
        # WAL: readers (status, cancel) never block the worker, and a commit is one append.
        self.conn.execute("PRAGMA journal_mode = WAL")
        # FULL: an intent must survive power loss before its send starts (fsync per commit).
        self.conn.execute("PRAGMA synchronous = FULL")
        # Under the write lock, so two processes opening an older file at once cannot both
        # decide a migration is pending and both apply it.
        with written(self):
            migrations.SQLITE.apply(self)
        # Read again what the statements compiled so far took from the file: a migration
        # may have made the indexes their INDEXED BY hints name (m004).
        self._indexes = None
        self._compiled.clear()

    def stage_table(self, stage: PlanStage) -> str:
        """The stage's file, attached until the transaction has ended (release_stage):
        SQLite compares and copies the rows itself, at half the cost of binding each one from
        Python (about 20 s of a million-row plan)."""
        if not self._stage_attached:
            stage.finish()
            self.execute("ATTACH DATABASE %(path)s AS plan_stage", {"path": str(stage.path)})
            self._stage_attached = True
        return "plan_stage.items"

    def release_stage(self) -> None:
        if self._stage_attached:
            self._stage_attached = False
            with suppress(sqlite3.Error):  # on a failed disk; closing the store lets go too
                self.conn.execute("DETACH DATABASE plan_stage")

    def secondary(self) -> Self:
        """Another connection to the same checked file, for a thread of our own."""
        engine = type(self)._connect(self.path, fresh=False)
        engine.conn.execute("PRAGMA synchronous = FULL")
        engine.signer = self.signer
        return engine

    def close(self) -> None:
        """Close the connection. One that read the file without locks (`immutable`) whose
        file another process wrote meanwhile (its state is not what it was at the open) raises
        ReadRaced: after reads that went well, since what they returned may mix two moments,
        and in place of an error of SQLite's that a read met (`database disk image is
        malformed`, text that does not decode: pages written under it), which is no damage
        of the file. Any other exception on its way out (a command's own answer, Ctrl-C, a
        closed pipe) is left as it is. So every read-only command, closing its store as it
        must, is checked, in this one place."""
        since, self._unlocked_since = self._unlocked_since, None
        self.conn.close()
        if since is None:
            return
        in_flight = sys.exc_info()[1]
        if in_flight is not None and not isinstance(in_flight, sqlite3.Error):
            return
        try:
            now: _FileState | None = _file_state(self.path)
        except OSError:
            now = None  # moved or deleted under the read
        if now != since:
            raise ReadRaced(
                f"{self.path}: another process wrote into this file while this command read "
                "it without locks (as read-only commands read a file no process has open, "
                "leaving no -wal or -shm beside it), so what it read, and printed, may mix "
                "two moments of the database. Nothing was changed."
            ).advise(NextStep.READ_AGAIN) from in_flight

    def _release(self) -> None:
        """Close the connection without judging its reads: the checks' own, which _checked
        judges by the file's state itself."""
        self._unlocked_since = None
        self.conn.close()

    def read_failure(self, exc: Exception) -> NotifierError:
        """A file is never out of reach (its dialect's `lost_errors` is empty): a failure of
        it is named as any other is."""
        return self.storage_failure(exc)

    def storage_failure(self, exc: Exception) -> NotifierError:
        """Name what went wrong with the file, the safe state it leaves, and the fix."""
        if (damaged := undecodable_text(exc, self.path)) is not None:
            return damaged
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        safe = ROLLED_BACK
        if code == sqlite3.SQLITE_FULL:
            return StorageFailed(
                f"{self.path}: the disk holding {self.path.name} is full. {safe} Free some "
                "space on that disk"
            ).advise(NextStep.RESUME)
        if code == sqlite3.SQLITE_IOERR:
            return StorageFailed(
                f"{self.path}: an I/O error while writing ({exc}). {safe} Check the disk "
                "(dmesg, df)"
            ).advise(NextStep.RESUME)
        if _locked(exc):
            # Mid-command: what goes on from what was recorded (a run's resume, or the same
            # command that recorded nothing), as after a full disk; the command layer words it.
            return StorageFailed(_held_by_another(self.path, exc, safe)).advise(NextStep.RESUME)
        if code == sqlite3.SQLITE_READONLY:
            return DatabaseUnwritable(
                f"{self.path}: cannot be written ({exc}). Nothing was changed by this write. "
                "Make the file and its directory writable, then run the command again."
            )
        return StorageFailed(f"{self.path}: the database could not be written ({exc}). {safe}")

    # ---------------------------------------------------------------- statements

    def execute(self, statement: str, params: Mapping[str, Any] | None = None) -> Rows:
        text, names = self._compiled.of(statement)
        args = [params[name] for name in names] if params else ()
        return self.conn.execute(text, args)  # type: ignore[no-any-return]

    def execute_many(self, statement: str, rows: Iterable[Mapping[str, Any]]) -> None:
        text, names = self._compiled.of(statement)
        self.conn.executemany(text, ([row[name] for name in names] for row in rows))

    def execute_ddl(self, statement: str) -> None:
        self.conn.execute(statement)

    def _compile(self, statement: str) -> tuple[str, tuple[str, ...]]:
        hints = {index: self.indexed(index) for index in statements.HINTED_INDEXES}
        return statements.for_sqlite(statement, statements.fragments(self.dialect, hints))

    # ---------------------------------------------------------------- transactions

    def begin_write(self, fence: Fence | None) -> Any:
        """BEGIN IMMEDIATE: the write lock up front (see core.Core.write)."""
        self._due.take()
        self.execute("BEGIN IMMEDIATE")
        if fence is None:
            return None
        statement, key = fence
        return self.execute(statement, {"key": key}).fetchone()

    def commit(self) -> None:
        """The transaction's events, numbered after each run's last and linked to it
        (chaining.py; the write lock is held since BEGIN IMMEDIATE), then COMMIT.

        Not if the file was moved away or removed since it was opened: SQLite would go on
        writing the file it has open, into a -wal beside the old path that it never
        checkpoints, and a run would report done what the file at hand shows undone."""
        if self._opened_file is not None and _identity(self.path) != self._opened_file:
            raise StorageFailed(
                f"{self.path}: moved or removed while this command wrote it (the file it has "
                f"open is no longer at that path). {ROLLED_BACK} Put the file back at "
                f"{self.path}, beside {self.path.name}-wal (which holds its last writes)"
            ).advise(NextStep.RESUME)
        if self._due.rows:
            runs = self._due.runs()
            heads = {
                run: chaining.head_of(self.execute(chaining.HEAD, {"run_id": run}).fetchone())
                for run in runs
            }
            self.conn.executemany(
                _INSERT_EVENTS, chaining.linked(self._due.take(), heads, self.signer)
            )
        self.execute("COMMIT")

    def roll_back(self) -> None:
        self._due.take()
        if self.conn.in_transaction:
            with suppress(Exception):  # a failed disk may refuse even the rollback
                self.conn.execute("ROLLBACK")

    def stream(self, statement: str, params: Mapping[str, Any]) -> Iterator[Any]:
        """Rows read as the caller goes (SQLite's cursor steps through the file)."""
        yield from self.execute(statement, params)

    def insert_pending(self, rows: Iterable[tuple[Any, ...]]) -> None:
        # Positional, as the rows come (a million of them: no mapping made per row).
        self.conn.executemany(_INSERT_PENDING, rows)

    def event(self, run_id: str, kind: str, item_seq: int | None, detail: str | None,
              at: str) -> None:  # fmt: skip
        self._due.add(run_id, kind, item_seq, detail, at)

    def events(self, run_id: str, kind: str, seqs: Sequence[int], detail: chaining.Detail,
               at: str) -> None:  # fmt: skip
        self._due.extend(run_id, kind, seqs, detail, at)

    def serialise_plans(self) -> None:
        """Nothing to take: BEGIN IMMEDIATE already holds the file."""

    def gather_statistics(self) -> None:
        """Nothing to gather: SQLite's INDEXED BY hints (indexed) stand in for them."""

    def indexed(self, index: str) -> str:
        """`INDEXED BY index` when the file has it (a read-only open of a file older than
        m004 does not): without statistics SQLite may prefer a full index of the run over a
        partial one of the few rows asked for."""
        return f"INDEXED BY {index}" if self.has_index(index) else ""

    def has_table(self, name: str) -> bool:
        return bool(self.execute(_HAS_TABLE, {"name": name}).fetchone())

    def has_index(self, name: str) -> bool:
        if self._indexes is None:
            self._indexes = {r[0] for r in self.conn.execute(_INDEXES)}
        return name in self._indexes

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.execute(f"PRAGMA table_info({table})")}

    # ---------------------------------------------------------------- checks

    def _check_pages_in_wal(self, short: str) -> None:
        """The file is shorter than its header promises, but a write-ahead log sits beside
        it: a checkpoint cut short (a kill, a full disk) leaves exactly this, and SQLite
        recovers the missing pages from the log on open. Refuse only if SQLite itself finds
        the database damaged."""
        rows = [r[0] for r in self.execute("PRAGMA quick_check(5)")]
        if rows != ["ok"]:
            raise StoreRefused(
                f"{self.path}: {short}, and SQLite's quick_check fails even with the "
                f"write-ahead log beside it ({'; '.join(_findings(rows))}). Restore it from a "
                "backup; this file was not changed."
            )

    def _check_schema(self) -> None:
        tables = {r[0] for r in self.execute(_TABLES)}
        (app_id,) = self.execute("PRAGMA application_id").fetchone()
        if not tables and app_id == 0:
            return  # an empty SQLite file: ours to initialise
        if app_id != migrations.APPLICATION_ID:
            listed = ", ".join(sorted(tables)[:6]) or "none"
            raise StoreRefused(
                f"{self.path}: this SQLite database was not written by notifier (tables: "
                f"{listed}). Point --db at a notifier receipts database or at a new path."
            )
        refuse_newer(self.path, migrations.SQLITE.applied(self), migrations.NAMES, "this file")


def _findings(rows: list[str]) -> list[str]:
    """quick_check's findings, one per line of its rows: a row may hold several lines,
    headed by the database it is about, and a refusal is one paragraph."""
    return [
        line.strip()
        for row in rows
        for line in row.splitlines()
        if line.strip() and not line.startswith("*** in database")
    ]


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...]) -> Any:
    return namedtuple("Row", names, rename=True)


# The description last read and its row class. A statement's rows share one description
# object, so a row of the same statement costs an identity check rather than a lookup by
# its column names; another statement's rows (or another thread's, in between) only miss.
# Correct whatever sqlite3 does with the object: the class is always the description's own.
_last_class: tuple[Any, Any] = ((), None)


def _named_row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> Any:
    """A row as a named tuple, as psycopg's namedtuple_row makes them on PostgreSQL: one
    way to read a row for the store's parts, whichever engine read it."""
    global _last_class  # noqa: PLW0603 (one slot, replaced whole: no torn read)
    description, row_class = _last_class
    if description is not cursor.description:
        description = cursor.description
        row_class = _row_class(tuple(column[0] for column in description))
        _last_class = (description, row_class)
    return row_class._make(values)


class _FileState(NamedTuple):
    inode: int
    size: int
    mtime_ns: int
    wal: bool  # whether a -wal is beside it


def _file_state(path: Path) -> _FileState:
    stat = path.stat()
    wal = path.with_name(path.name + "-wal").exists()
    return _FileState(stat.st_ino, stat.st_size, stat.st_mtime_ns, wal)


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


def _create_atomically(path: Path, connect: Callable[[Path], SqliteEngine]) -> None:
    """Make a new, fully initialised database at `path`, unless another process got there
    first. It is built under a temporary name and linked into place in one step: a process
    racing us never sees a half-made (0-byte) file, which would rightly be refused."""
    temporary = path.with_name(f".{path.name}.creating-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        engine = connect(temporary)
        try:
            # Into one self-contained file here, not by close(), which would swallow a
            # failure: on a full disk the schema would stay in the -wal (deleted below) and
            # a short file be linked into place, refused from then on as truncated.
            engine.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise StorageFailed(
                f"{path}: the new database could not be written ({exc}); no database was "
                "created. Free some space on that disk, then run the command again."
            ) from None
        finally:
            engine.close()
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
    if not directory.is_dir():
        raise DatabaseUnwritable(
            f"{path}: its directory {directory} does not exist. Nothing was changed. Create "
            f"it (`mkdir -p {directory}`) or pass a --db in a directory that exists."
        )
    if path.exists() and not os.access(path, os.W_OK):
        why = "the file is read-only"
    elif not os.access(directory, os.W_OK | os.X_OK):
        why = f"its directory {directory} is not writable"
    else:
        return
    raise DatabaseUnwritable(f"{path}: cannot be written: {why}. Nothing was changed.").advise(
        NextStep.READ_ONLY
    )


def _held_by_another(path: Path, exc: Exception, safe: str) -> str:
    """Another program's lock outlasted the busy timeout, `safe` saying what that left: at
    the open, the command runs again; at a write, what goes on from what was recorded is the
    command layer's to word (storage_failure)."""
    return (
        f"{path}: locked by another program for longer than the 10 s busy timeout ({exc}). "
        f"{safe} Find what holds it (e.g. `fuser {path}`) and let it finish or stop it"
    )


def _locked_at_open(path: Path, exc: Exception) -> StorageFailed:
    """The open met another program's lock: nothing was done, so the command runs again."""
    said = _held_by_another(path, exc, "Nothing was read or changed.")
    return StorageFailed(f"{said}, then run the command again.")


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device and inode), None when there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _unopenable(path: Path, exc: Exception) -> StorageFailed:
    """The disk under a healthy file failed its open: opening it to write, or to read beside a
    -wal, needs room for the -wal and -shm (SQLite sizes the -shm as it maps it)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    safe = "The database was not changed."
    if code == sqlite3.SQLITE_FULL or _free_bytes(path.parent) < _ROOM_TO_OPEN:
        return StorageFailed(
            f"{path}: cannot be opened: the disk holding {path.name} is full ({exc}). {safe} "
            "Free some space on that disk, then run the command again."
        )
    return StorageFailed(
        f"{path}: cannot be opened: an I/O error ({exc}). {safe} Check the disk (dmesg, df), "
        "then run the command again."
    )


# Less free space than this on the disk of a file whose open met an I/O error: the error is
# the full disk (a -shm of 32 KiB and a first write to the -wal could not be made).
_ROOM_TO_OPEN = 1 << 20


def _free_bytes(directory: Path) -> int:
    try:
        disk = os.statvfs(directory)
    except OSError:
        return _ROOM_TO_OPEN  # unknown: named as an I/O error, which it is
    return disk.f_bavail * disk.f_frsize


def _disk_failed(exc: Exception) -> bool:
    """Whether `exc` is the disk's failure (full, or an I/O error), not the file's content."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


def _locked(exc: Exception) -> bool:
    """Whether `exc` is another connection's lock outlasting the busy timeout."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
