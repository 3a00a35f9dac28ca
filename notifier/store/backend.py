"""What the store asks of a database engine, and how the engines' SQL differs, as data.

The store's parts (core.py and the modules over it) are written once for both engines.
Everything that differs between SQLite and PostgreSQL is either a field of the engine's
`Dialect` (a fragment of SQL, filled into the statements of statements/ where they name it;
a flag; the driver's storage error classes) or a method of its
`Engine` (how a write transaction begins and commits, a snapshot, a streamed read, a bulk
insert, how events are numbered, how a storage failure is named). sqlite.py and postgres.py
each hold one engine; neither is imported by the other, nor by the parts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from notifier.domain.redact import redacted

if TYPE_CHECKING:
    from notifier.domain.chain import Signer
    from notifier.domain.errors import NotifierError
    from notifier.store.stage import PlanStage


@dataclass(frozen=True)
class Dialect:
    """An engine's differences in the store's SQL, as data (one frozen record per engine)."""

    name: str
    # Errors of the driver that mean "the database could not be written" (core.Core.write).
    storage_errors: tuple[type[Exception], ...]
    # Errors of the driver that mean "the database could not be reached" (a server's session
    # ended or cut: `snapshot`); none for a file, whose failed reads say what they met.
    lost_errors: tuple[type[Exception], ...]
    # The word that joins two tables in the order written (SQLite's CROSS JOIN fixes it: its
    # planner otherwise starts from items; PostgreSQL plans the order itself).
    ordered_join: str
    # How a claim locks the rows it picks: two workers' claims never pick the same row, and
    # never wait for each other's rows (PostgreSQL's FOR UPDATE SKIP LOCKED).
    claim_lock: str
    # How a transaction reads a row it goes on to write, holding it to COMMIT against any
    # other writer of it. Empty on SQLite, where BEGIN IMMEDIATE holds the whole file.
    row_lock: str
    # How a fenced transaction reads its worker's lease row: held to COMMIT, so a reap of
    # that worker (reap_lock) cannot land before the commit, or the commit sees the reap;
    # the worker's own heartbeat, which writes no key, never waits for it.
    share_lock: str
    # How a reap takes a worker's row: the one lock that conflicts with share_lock.
    reap_lock: str
    # A read transaction: every query in it sees one committed state.
    begin_snapshot: str
    # Seconds since the epoch on the database's own clock (one clock for every worker).
    now_s: str
    # The two-argument minimum.
    least: str
    # The SQL form of suppression.address_key applied to `{}` (statements.suppressions).
    address_of: str
    # Whether INSERT/UPDATE may stand inside WITH: a group commit's acks and claim then go to
    # the server as one statement each, not four (ledger.py).
    writing_ctes: bool
    # Whether many processes may work one run at once, each under a worker lease of its own
    # (PostgreSQL's row locks; one SQLite file has one writer at a time).
    shares_runs: bool


class Rows(Protocol):
    """What a statement returns, on either engine: the driver's own cursor, its rows named
    tuples (a column by position or by name, `row.state`)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


# A lease fence: the locking read of the version a writer's lease must still hold, and its
# one key (core.Core._fence_query).
Fence = tuple[str, Any]


class Engine(Protocol):
    """One open connection to one database, as the store's parts use it."""

    # What links the events this connection writes (chain.py): the process's audit key,
    # or none. Store.open sets it; a secondary connection takes its engine's.
    signer: Signer

    @property
    def dialect(self) -> Dialect: ...

    @property
    def path(self) -> Path | str:
        """For an SQLite file its path; for PostgreSQL the server and database (never a
        password), as messages name it."""
        ...

    def execute(self, statement: str, params: Mapping[str, Any] | None = None) -> Rows:
        """A statement of statements/ (its notation), compiled for this engine the first
        time, sent with `params` by name."""
        ...

    def execute_many(self, statement: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """`execute` once per mapping of `rows`."""
        ...

    def execute_ddl(self, statement: str) -> None:
        """A statement of DDL as written, no parameters (a trigger's body may hold anything)."""
        ...

    def begin_write(self, fence: Fence | None) -> Any:
        """BEGIN a write transaction holding what it writes; with `fence`, then read the
        fence's row (an engine may send both at once) and return it (None without)."""
        ...

    def commit(self) -> None:
        """The transaction's due events, numbered and linked (chaining.py), then COMMIT."""
        ...

    def roll_back(self) -> None:
        """ROLLBACK if a transaction is open; never raises (a failed disk may refuse it)."""
        ...

    def stream(self, statement: str, params: Mapping[str, Any]) -> Iterator[Any]:
        """`execute`'s rows read as the caller goes, never all held at once."""
        ...

    def insert_pending(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Bulk insert of item rows (run_id, the item columns, updated_at), all `pending`."""
        ...

    def read_failure(self, exc: Exception) -> NotifierError:
        """What a snapshot's read failing with one of `dialect.lost_errors` means."""
        ...

    def storage_failure(self, exc: Exception) -> NotifierError:
        """Name what went wrong with the database, the safe state it leaves, and the fix."""
        ...

    def event(self, run_id: str, kind: str, item_seq: int | None, detail: str | None,
              at: str) -> None:  # fmt: skip
        """One event of the run, numbered after its last (`detail` already JSON)."""
        ...

    def events(
        self,
        run_id: str,
        kind: str,
        seqs: Sequence[int],
        detail: str | Mapping[int, str | None] | None,
        at: str,
    ) -> None:
        """`event` for several items at once: one shared detail, or each seq's own."""
        ...

    def stage_table(self, stage: PlanStage) -> str:
        """The name under which this connection reads `stage`'s items until the current
        transaction ends (each engine makes it visible its own way)."""
        ...

    def release_stage(self) -> None:
        """Let go of what `stage_table` held past its transaction."""
        ...

    def serialise_plans(self) -> None:
        """In a plan's write transaction: plans one at a time (each compares its rows with
        every run's before it inserts)."""
        ...

    def gather_statistics(self) -> None:
        """After a plan's items are inserted (PostgreSQL's planner needs them)."""
        ...

    def indexed(self, index: str) -> str:
        """`INDEXED BY index` where the engine takes such a hint and has the index, else ''."""
        ...

    def has_table(self, name: str) -> bool: ...

    def has_index(self, name: str) -> bool: ...

    def columns(self, table: str) -> set[str]: ...

    def secondary(self) -> Engine:
        """Another connection to the same checked database, for a thread of our own."""
        ...

    def close(self) -> None: ...


@contextmanager
def written(engine: Engine) -> Iterator[None]:
    """One unfenced write transaction of the engine's own, as core.Core.write makes
    the store's: for what an open writes (migrations) before any store exists."""
    try:
        engine.begin_write(None)
        yield
        engine.commit()
    except engine.dialect.storage_errors as exc:
        engine.roll_back()
        raise engine.storage_failure(exc) from exc
    except BaseException:
        engine.roll_back()
        raise


def first_line(exc: BaseException) -> str:
    """A driver's error as a message quotes it: its first line, or its type's name, without
    the password of PGPASSWORD (a server that asks for it in clear may quote it back in its
    refusal). Masked before the lines are split: one holding a line break stays masked."""
    text = redacted(str(exc), [os.environ.get("PGPASSWORD")])
    return (text.strip().splitlines() or [type(exc).__name__])[0]


@contextmanager
def snapshot(engine: Engine) -> Iterator[None]:
    """Reads that see one committed state, whatever other processes commit meanwhile (the
    dialect's `begin_snapshot`); rolled back after, as nothing was written. A read whose
    server could not be reached (a PostgreSQL session the server ended, a failover) is a
    storage failure naming it, never the driver's error taken for a bug."""
    try:
        engine.execute(engine.dialect.begin_snapshot)
        try:
            yield
        finally:
            engine.roll_back()
    except engine.dialect.lost_errors as exc:
        raise engine.read_failure(exc) from exc


@contextmanager
def closed_if_failed(engine: Engine) -> Iterator[None]:
    """Close `engine` if what the block does with it fails (an open's checks or migrations),
    and let the failure through: a refused open leaves no connection behind."""
    try:
        yield
    except BaseException:
        engine.close()
        raise


def unwritten_text(data: bytes) -> str:
    """A text cell as read for an audit: UTF-8, or (written by no notifier) its bytes kept
    as surrogates, so that it differs from every text notifier wrote and is named."""
    return data.decode("utf-8", "surrogateescape")
