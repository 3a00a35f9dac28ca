"""The PostgreSQL engine (backend.py; `--db postgresql://…`): the store's parts and SQL over
psycopg 3, so several workers on several machines can share one run. Imported only when a
postgresql:// target is opened: psycopg's import costs every command about 0.3 s of
start-up, which `status` or `resume` on an SQLite file must not pay.

Writers do not take turns per schema, as SQLite's do per file (BEGIN IMMEDIATE): each
write transaction locks only the rows it needs, so the item writes of two workers' group
commits on one run go on side by side, and two runs never wait for each other at all.

- A run's events are numbered and linked at COMMIT (`commit`, chaining.py), under its `runs`
  row taken FOR NO KEY UPDATE as the transaction's last step: contiguous and unique per run,
  each linked to the one before. The run counters move at COMMIT too, once per transaction
  (m017), under that row.
- A run's state read then moved, a join, the exclusive lease, leaving, adopting: the run's
  row is read FOR NO KEY UPDATE first (core's `locked_run`).
- Fencing: a worker's lease row is read FOR SHARE and held to COMMIT, so a reap waits for a
  commit in progress, or the commit sees the reap and aborts.
- Claims take their rows FOR UPDATE SKIP LOCKED; buckets and gates are single statements.
- Plans (their "already planned" comparison) and migrations each take an advisory lock of
  their own; no write of a run does.

A deadlock's victim is run again (core.retried). docs/design.md says the same at length.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Self

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.rows import namedtuple_row

from notifier.domain.chain import UNKEYED, Signer
from notifier.domain.errors import NextStep, NotifierError
from notifier.store import chaining, migrations, statements
from notifier.store.backend import Dialect, Fence, Rows, closed_if_failed, first_line, written
from notifier.store.checks import Checks, refuse_newer
from notifier.store.core import ROLLED_BACK
from notifier.store.exceptions import (
    DatabaseUnwritable,
    LeaseLost,
    LossCause,
    NoDatabase,
    StorageFailed,
    StoreRefused,
    WriteConflict,
)
from notifier.store.stage import _COMPARED_COLUMNS, _PENDING_COLUMNS, PlanStage

# psycopg logs what it ignores while it gives up a connection the server ended (a pipeline
# left unfinished): the store raises that failure as its own message, and a command shows
# nothing else of it (without a handler here, Python would print the record to stderr).
logging.getLogger("psycopg").addHandler(logging.NullHandler())

# How long a write waits for another process's transaction, as SQLite's busy_timeout.
LOCK_TIMEOUT_S = 10
# How long the server lets a write transaction sit idle (its process frozen, or cut off by
# the network, between two statements) before it ends the session and the rows it held
# go: shorter than LOCK_TIMEOUT_S, so a writer waiting for them gets them before its own
# lock timeout. A live process never idles this long inside a transaction: it sends the
# next statement as soon as the last is answered.
IDLE_IN_WRITE_S = 5
_BOUND_IDLE = f"SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_WRITE_S}s'"


_NOTHING_WRITTEN = "Nothing was written."


def _waited(path: str, exc: Exception, what: str, safe: str) -> StorageFailed | None:
    """A statement that waited past a bound: a lock another session held longer than the
    lock timeout (a migration, an administrator's LOCK TABLE, a VACUUM FULL), or one the
    server cancelled. None: neither. `safe` says what the failure left. What goes on from
    what was recorded (a run's resume, or the same command) is the command layer's to word,
    as after any storage failure."""
    cause = first_line(exc)
    if isinstance(exc, pg_errors.LockNotAvailable):
        return StorageFailed(
            f"{path}: locked by another session for longer than {LOCK_TIMEOUT_S} s ({cause}). "
            f"{safe} Find it in pg_stat_activity and let it finish or end it"
        ).advise(NextStep.RESUME)
    if isinstance(exc, pg_errors.QueryCanceled):
        # Not a lock (that is LockNotAvailable): every session clears statement_timeout
        # (_session_options), so an administrator cancelled it (pg_cancel_backend) or set one.
        return StorageFailed(
            f"{path}: the server cancelled this {what} ({cause}): an administrator's "
            f"pg_cancel_backend, or a statement_timeout set on the connection. {safe} Let it "
            "run"
        ).advise(NextStep.RESUME)
    return None


def _session_options(url: str) -> str:
    """The startup options of a session: the URL's own (or PGOPTIONS), then notifier's.

    A command bounds its own waits (the lock timeout; a write's idle bound, _BOUND_IDLE).
    A default every session of the database or role starts with (ALTER DATABASE … SET,
    PGOPTIONS, the URL's options), written for interactive sessions, would cancel a plan
    half stored or end a report's snapshot, and again on every retry. Cleared as the session
    starts, not by a first statement, which that default could itself cancel: a client's
    startup options outrank a database's or role's defaults, and of two `-c` the later wins.
    """
    given = conninfo_to_dict(url).get("options") or os.environ.get("PGOPTIONS", "")
    ours = (
        f"-c lock_timeout={LOCK_TIMEOUT_S}s -c statement_timeout=0 "
        "-c idle_in_transaction_session_timeout=0"
    )
    return f"{given} {ours}".strip()


# A transaction-scoped lock of the schema, for what must run one at a time in it: opens
# applying migrations, and plans (never a run's writes: see PostgresEngine.commit).
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext(%(key)s || ':' || current_schema()))"
# The engine's own statements (the notation of statements/), used on PostgreSQL only.
# The catalog's own tables, not information_schema's views: those check the privileges on
# every relation of the database, and took a new session twice as long to read. Unlike them,
# these list a table this role may not read too: it is there all the same, and a schema
# holding it is not an empty one to create notifier's tables in.
_IN_SCHEMA = "c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
_KINDS = "c.relkind IN ('r', 'v', 'f', 'p')"  # information_schema.tables': tables, views…
_TABLES = f"SELECT c.relname FROM pg_class c WHERE {_IN_SCHEMA} AND {_KINDS}"
_HAS_TABLE = f"{_TABLES} AND c.relname = %(name)s"
_HAS_INDEX = (
    f"SELECT 1 FROM pg_class c WHERE {_IN_SCHEMA} AND c.relkind = 'i' AND c.relname = %(name)s"
)
_COLUMNS = (
    "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
    f"WHERE {_IN_SCHEMA} AND {_KINDS} AND c.relname = %(table)s "
    "AND a.attnum > 0 AND NOT a.attisdropped"
)
# The runs a transaction wrote events of, their rows taken in run_id order (commit).
_LOCK_RUNS = (
    "SELECT 1 FROM runs WHERE run_id = ANY(CAST(%(runs)s AS TEXT[])) ORDER BY run_id {row_lock}"
)
# A transaction's events (commit), numbered and linked (chaining.py): every column an array.
_INSERT_EVENTS = (
    f"INSERT INTO events ({chaining.COLUMNS}) SELECT * FROM unnest(CAST(%(run_ids)s AS TEXT[]), "
    "CAST(%(seq_nos)s AS INTEGER[]), CAST(%(ats)s AS TEXT[]), CAST(%(kinds)s AS TEXT[]), "
    "CAST(%(item_seqs)s AS INTEGER[]), CAST(%(details)s AS TEXT[]), "
    "CAST(%(prev_hashes)s AS TEXT[]), CAST(%(hashes)s AS TEXT[]))"
)


def describe(url: str) -> str:
    """The server and database of `url` for messages: never its password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(unparsable URL)"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    user = f"{info['user']}@" if info.get("user") else ""
    return f"postgresql://{user}{host}:{port}/{info.get('dbname', '')}"


POSTGRES = Dialect(
    name="postgresql",
    storage_errors=(
        psycopg.OperationalError,
        pg_errors.ReadOnlySqlTransaction,
        pg_errors.IdleInTransactionSessionTimeout,
    ),
    lost_errors=(psycopg.OperationalError,),
    ordered_join="JOIN",  # PostgreSQL plans the join order itself
    claim_lock="FOR UPDATE SKIP LOCKED",
    # NO KEY: rows that refer to the one held (items, events…) may still be inserted.
    row_lock="FOR NO KEY UPDATE",
    # KEY SHARE, not SHARE: the heartbeat's renewal (a FOR NO KEY UPDATE) goes on beside
    # the worker's own open transaction; only FOR UPDATE (reap_lock) waits for it.
    share_lock="FOR KEY SHARE",
    reap_lock="FOR UPDATE",
    begin_snapshot="BEGIN ISOLATION LEVEL REPEATABLE READ",
    now_s="EXTRACT(EPOCH FROM clock_timestamp())::float8",
    least="LEAST",
    # LOWER lower-cases ASCII letters only under the "C" collation, as SQLite's does: plan
    # time matches a suppressed address alike on both engines (suppressions.py). The result
    # is compared in the database's collation, the primary key's: compared under "C", the
    # claim's probe could not use the key and scanned the whole list for every row.
    address_of='(LOWER(TRIM({}) COLLATE "C") COLLATE "default")',
    writing_ctes=True,  # each round trip to the server is felt in a group commit
    shares_runs=True,
)


class PostgresEngine:
    """Connecting to the server and the checks that come first, as for an SQLite file: a
    schema that is not notifier's, or is newer, is refused untouched. Then the engine's part
    of every transaction (engine.Engine)."""

    dialect = POSTGRES

    def __init__(self, url: str, raw: psycopg.Connection[Any], *, readonly: bool = False) -> None:
        self.url = url
        self.path = describe(url)
        # psycopg's connection, in autocommit: transactions are begun explicitly (BEGIN), and
        # every statement goes through a RawCursor (execute).
        self.raw = raw
        self._readonly = readonly  # opened for a read-only command
        # Events wait in the transaction until COMMIT (see commit), in the order written.
        self._due = chaining.DueEvents()
        self.signer: Signer = UNKEYED  # links the events (chain.py); Store.open sets it
        self._stage_copied = False  # the plan's stage copied into this transaction's table
        # the statements (statements/), with `$n` parameters, and the names bound to them in order
        self._compiled = statements.Compiled(self._compile)

    @classmethod
    def open(
        cls, path: Path | str, *, create: bool = False, readonly: bool = False,
        audited: bool = False,
    ) -> Self:  # fmt: skip
        """As SqliteEngine.open: `audited` (with `readonly`) opens a schema whose rows
        contradict each other, for `verify` to name them."""
        url = str(path)
        engine = cls._connect(url, readonly=readonly)
        with closed_if_failed(engine):
            if engine._check_schema() and not create:
                raise NoDatabase(f"{engine.path}: no notifier database here yet.").advise(
                    NextStep.SEND_FIRST
                )
            if not (readonly and audited):
                Checks(engine).check_invariants()
            if not readonly:
                engine._prepare()
        return engine

    @classmethod
    def _connect(cls, url: str, *, readonly: bool = False) -> Self:
        try:
            raw = psycopg.connect(
                url,
                autocommit=True,
                row_factory=namedtuple_row,
                cursor_factory=psycopg.RawCursor,
                connect_timeout=10,
                options=_session_options(url),
                # Which process a session belongs to, in pg_stat_activity (an operator's
                # look at a lock, a test waiting for a killed process's sessions to end),
                # unless the URL or PGAPPNAME names it otherwise.
                fallback_application_name=f"notifier[{os.getpid()}]",
            )
        except psycopg.Error as exc:
            raise NoDatabase(
                f"{describe(url)}: cannot connect to PostgreSQL ({first_line(exc)}). Check "
                "that the server is running and reachable, and the user, database and "
                "password (PGPASSWORD or ~/.pgpass; never in the URL) of --db or NOTIFIER_DB."
            ) from exc
        if readonly:  # the server itself refuses any write from a read-only command
            raw.execute("SET default_transaction_read_only = on")
        return cls(url, raw, readonly=readonly)

    def secondary(self) -> Self:
        engine = type(self)._connect(self.url)
        engine.signer = self.signer
        return engine

    # ---------------------------------------------------------------- statements

    def execute(self, statement: str, params: Mapping[str, Any] | None = None) -> Rows:
        """Through psycopg's RawCursor, which takes PostgreSQL's own `$n` parameters and
        parses no query text of its own: the set-based statements of a group commit run to
        thousands of characters, past psycopg's query cache, and parsing them each time
        cost more CPU than the rest of the commit."""
        text, names = self._compiled.of(statement)
        cursor = psycopg.RawCursor(self.raw)
        args = [params[name] for name in names] if params else None
        if self._inside_transaction():
            # A write's (or a snapshot's) statement: its transaction's end says what a
            # failure means (core.write: rolled back, or the lease lost meanwhile).
            return cursor.execute(text, args)
        try:
            return cursor.execute(text, args)
        except psycopg.OperationalError as exc:
            # A statement of its own (a read of the run between two commits, most often):
            # a connection the server ended, or lost, is a storage failure, not a crash.
            raise self._lost(exc) from exc

    def _inside_transaction(self) -> bool:
        # Asked of every statement: libpq's own connection (psycopg's `pgconn`), not
        # `info`, which builds an object per call (0.5 against 3.7 microseconds).
        pgconn = self.raw.pgconn
        return (
            pgconn.transaction_status != TransactionStatus.IDLE
            or pgconn.pipeline_status != PipelineStatus.OFF
        )

    def _lost(self, exc: psycopg.OperationalError) -> NotifierError:
        """What a statement outside any transaction failing on the connection means."""
        if (waited := _waited(self.path, exc, "statement", _NOTHING_WRITTEN)) is not None:
            return waited
        return StorageFailed(
            f"{self.path}: the database could not be reached ({first_line(exc)}). Nothing "
            "was being written: every outcome recorded before it is safe, and anything in "
            "flight is settled by query on resume. Check the server and the connection to it"
        ).advise(NextStep.RESUME)

    def execute_many(self, statement: str, rows: Iterable[Mapping[str, Any]]) -> None:
        text, names = self._compiled.of(statement)
        cursor = psycopg.RawCursor(self.raw)
        cursor.executemany(text, ([row[name] for name in names] for row in rows))

    def execute_ddl(self, statement: str) -> None:
        self.raw.execute(statement.encode())  # bytes: sent as written, nothing parsed

    def _compile(self, statement: str) -> tuple[str, tuple[str, ...]]:
        hints = {index: self.indexed(index) for index in statements.HINTED_INDEXES}
        return statements.for_postgres(statement, statements.fragments(self.dialect, hints))

    def _prepare(self) -> None:
        if migrations.POSTGRES.applied(self) >= migrations.NAMES:
            return  # the usual open: nothing to apply, no lock to wait for
        with written(self):
            # Migrations one process at a time: two opening an older schema at once must not
            # both find one pending (apply reads them again under the lock). Only opens that
            # migrate take this lock; no write of a run ever does.
            self.execute(_SCHEMA_LOCK, {"key": "notifier"})
            migrations.POSTGRES.apply(self)

    def serialise_plans(self) -> None:
        """Plans one at a time (Planning.transaction): a plan compares its rows with every run's
        before it inserts, so two `send`s of one batch must not both pass the comparison.
        Only plans take this lock: the workers' writes never wait for it."""
        self.execute(_SCHEMA_LOCK, {"key": "notifier-plans"})

    def begin_write(self, fence: Fence | None) -> Any:
        """BEGIN and the fence's locking read in one round trip (psycopg's pipeline mode): a
        group commit of the pipeline is a handful of round trips to the server, and each is
        felt."""
        self._due.take()
        with self.raw.pipeline():
            self.execute("BEGIN")
            self.execute(_BOUND_IDLE)
            if fence is None:
                return None
            statement, key = fence
            cursor = self.execute(statement, {"key": key})
        return cursor.fetchone()

    # ---------------------------------------------------------------- events, at COMMIT

    def event(self, run_id: str, kind: str, item_seq: int | None, detail: str | None,
              at: str) -> None:  # fmt: skip
        self._due.add(run_id, kind, item_seq, detail, at)

    def events(self, run_id: str, kind: str, seqs: Sequence[int], detail: chaining.Detail,
               at: str) -> None:  # fmt: skip
        self._due.extend(run_id, kind, seqs, detail, at)

    def commit(self) -> None:
        """The transaction's events, numbered and linked, then COMMIT.

        What serialises two writers of one run is its `runs` row, taken here, as late as a
        transaction can take it: the item writes of two workers' group commits go on side
        by side, and only this last step runs one at a time per run. Under the row, the
        next statement reads the run's head afresh (READ COMMITTED: each statement its own
        snapshot): its last event's number and hash, so the numbers stay contiguous and
        unique and each new event links to the one really before it. The links are made
        here (chaining.linked: the key never goes to the server), so this takes two round
        trips: the row and the heads, then the events and COMMIT. The run counters (m017)
        move at COMMIT, under the row too. Rows are taken in run_id order, so two
        transactions never wait for each other's. Two runs never share a row: they never
        wait for each other at all."""
        if not self._due.rows:
            self.execute("COMMIT")
            return
        runs = self._due.runs()
        with self.raw.pipeline():
            self.execute(_LOCK_RUNS, {"runs": runs})
            read = [(run, self.execute(chaining.HEAD, {"run_id": run})) for run in runs]
        heads = {run: chaining.head_of(cursor.fetchone()) for run, cursor in read}
        rows = chaining.linked(self._due.take(), heads, self.signer)
        run_ids, seq_nos, ats, kinds, item_seqs, details, prevs, hashes = map(
            list, zip(*rows, strict=True)
        )
        with self.raw.pipeline():
            self.execute(
                _INSERT_EVENTS,
                {"run_ids": run_ids, "seq_nos": seq_nos, "ats": ats, "kinds": kinds,
                 "item_seqs": item_seqs, "details": details, "prev_hashes": prevs,
                 "hashes": hashes},
            )  # fmt: skip
            self.execute("COMMIT")

    def roll_back(self) -> None:
        self._due.take()
        if self.raw.info.transaction_status != TransactionStatus.IDLE:
            with suppress(Exception):  # a lost connection may refuse even the rollback
                self.execute("ROLLBACK")

    def close(self) -> None:
        self.raw.close()

    def _check_schema(self) -> bool:
        """True for an empty schema (ours to initialise); refuse a foreign or newer one."""
        # notifier's own table first, looked up by name in the catalog's index: listing a
        # schema's tables reads the whole of pg_class, which on a server holding many schemas
        # (or dead rows its autovacuum has not cleared yet) costs each open more than the rest.
        if self.has_table(migrations.POSTGRES.table):
            applied = migrations.POSTGRES.applied(self)
            refuse_newer(self.path, applied, migrations.NAMES, "the database")
            return False
        tables = {r[0] for r in self.execute(_TABLES)}
        if not tables:
            return True
        listed = ", ".join(sorted(tables)[:6])
        raise StoreRefused(
            f"{self.path}: this PostgreSQL schema was not written by notifier (tables: "
            f"{listed}). Point --db at a notifier database, or at an empty database or "
            "schema (options=-csearch_path=NAME in the URL)."
        )

    def storage_failure(self, exc: Exception) -> NotifierError:
        cause = first_line(exc)
        if isinstance(exc, pg_errors.IdleInTransactionSessionTimeout):
            return LeaseLost(
                f"{self.path}: {LossCause.SESSION_ENDED}, after {IDLE_IN_WRITE_S} s idle",
                LossCause.SESSION_ENDED,
            )
        if isinstance(exc, pg_errors.DiskFull):
            return StorageFailed(
                f"{self.path}: the PostgreSQL server's disk is full ({cause}). {ROLLED_BACK} "
                "Free space on the server"
            ).advise(NextStep.RESUME)
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            return DatabaseUnwritable(
                f"{self.path}: the server refuses writes ({cause}). Nothing was changed by "
                "this write. Point --db at a writable primary, then run the command again."
            )
        if isinstance(exc, pg_errors.DeadlockDetected | pg_errors.SerializationFailure):
            return WriteConflict(
                f"{self.path}: the server aborted this write in a conflict with another "
                f"writer ({cause}), again on each retry. {ROLLED_BACK} Run the command again."
            )
        if (waited := _waited(self.path, exc, "write", ROLLED_BACK)) is not None:
            return waited
        return StorageFailed(
            f"{self.path}: the database could not be written ({cause}). {ROLLED_BACK} Check "
            "the server and the connection to it"
        ).advise(NextStep.RESUME)

    def read_failure(self, exc: Exception) -> NotifierError:
        """What a snapshot's read failing means (backend.snapshot; dialect.lost_errors)."""
        if (waited := _waited(self.path, exc, "read", _NOTHING_WRITTEN)) is not None:
            return waited
        return StorageFailed(
            f"{self.path}: the database could not be reached ({first_line(exc)}). "
            f"{_NOTHING_WRITTEN} Check the server and the connection to it, then run the "
            "same command again."
        )

    def stream(self, statement: str, params: Mapping[str, Any]) -> Iterator[Any]:
        """Rows from a server-side cursor, a chunk at a time: a client-side cursor would hold
        every row of a million-item report in memory at once."""
        text, names = self._compiled.of(statement)
        with (
            self.raw.transaction(),
            psycopg.RawServerCursor(self.raw, "notifier_stream") as cursor,
        ):
            cursor.itersize = 2000
            cursor.execute(text, [params[name] for name in names])
            yield from cursor

    def stage_table(self, stage: PlanStage) -> str:
        """The server cannot read the stage's file: its rows are copied, in one COPY stream,
        into a temporary table that the transaction's end drops. The comparison with
        earlier runs and the copy into `items` are then one statement each on the server."""
        if not self._stage_copied:
            if self._readonly:
                # A dry run's snapshot (compare_plan): the first statement of a transaction
                # that is rolled back, and writes only this temporary table, which the
                # server refuses to create in a read-only one.
                self.execute("SET TRANSACTION READ WRITE")
            self.execute(
                "CREATE TEMPORARY TABLE plan_stage_items (seq INTEGER, item_id TEXT, "
                "channel TEXT, target TEXT, payload TEXT, idempotency_key TEXT, "
                "intent_digest TEXT, not_after TEXT, identity TEXT, not_before TEXT, "
                "send_window TEXT, send_tz TEXT, row_digest TEXT) ON COMMIT DROP"
            )
            with self.raw.cursor().copy(
                f"COPY plan_stage_items ({_COMPARED_COLUMNS}) FROM STDIN"
            ) as copy:
                for row in stage.rows(_COMPARED_COLUMNS):
                    copy.write_row(row)
            self._stage_copied = True
        return "plan_stage_items"

    def release_stage(self) -> None:
        self._stage_copied = False  # dropped with its transaction, committed or not

    def gather_statistics(self) -> None:
        """Statistics for the rows just copied, before autovacuum gets to them (a minute or
        more): without any, the planner guesses one row per run and each claim's move
        filtered every pending item of the run instead of looking up its seqs. ANALYZE
        samples a bounded number of rows, and runs inside this transaction."""
        self.execute("ANALYZE items")

    def insert_pending(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """COPY: a million intents in one stream, several times faster than INSERTs."""
        with self.raw.cursor().copy(f"COPY items ({_PENDING_COLUMNS}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row((*row, "pending", 0))
        self.gather_statistics()

    def indexed(self, index: str) -> str:
        return ""  # PostgreSQL's planner has statistics; SQLite's INDEXED BY has no twin

    def has_table(self, name: str) -> bool:
        return bool(self.execute(_HAS_TABLE, {"name": name}).fetchone())

    def has_index(self, name: str) -> bool:
        return bool(self.execute(_HAS_INDEX, {"name": name}).fetchone())

    def columns(self, table: str) -> set[str]:
        return {r[0] for r in self.execute(_COLUMNS, {"table": table})}
