"""The receipts store, split along its seams: one engine per database (engine.py: the
protocol and the dialect record; sqlite.py for an SQLite file, postgres.py for a PostgreSQL
server), the checks every open runs (checks.py, both engines), the ledger of writes
(ledger.py) and of drafts (drafts.py), leases (leases.py) and queries (queries.py), over one
shared core (core.py). `Store` is their union, over one engine. target.py parses --db once
into a Target (an SQLite file or a PostgreSQL URL), which opens the store of its engine;
the schema and its migrations are migrations.py's. All SQL lives in this package."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from .buckets import Buckets
from .checks import Checks
from .core import ATTENTION_STATES
from .drafts import Drafts
from .exceptions import (
    DatabaseUnwritable,
    LeaseHeld,
    LeaseLost,
    LostRace,
    NoDatabase,
    PlanRefused,
    RunExists,
    StorageFailed,
    StoreRefused,
)
from .leases import Leases
from .prior import Prior
from .queries import Queries
from .stage import PlanStage
from .target import NotADatabasePath, Target
from .target import parse as parse_target


class Store(Drafts, Leases, Queries, Buckets):
    """One receipts database: `Store.open(db)`, where `db` is a path (SQLite, the embedded
    default), a postgresql:// URL, or the Target either parses to; the store over that
    target's engine."""

    @classmethod
    def open(cls, db: Path | str | Target, *, create: bool = False, readonly: bool = False) -> Self:
        """The checked store (StoreRefused, NoDatabase, …): nothing is written to a database
        that fails the checks, nor with `readonly`."""
        target = parse_target(db) if isinstance(db, Path | str) else db
        return cls(target.engine(create=create, readonly=readonly))

    @property
    def shares_runs(self) -> bool:
        """Whether many processes may work one run at once, each under a worker lease of its
        own (lease.for_sending picks the lease by it); the engine's answer, as its Target's."""
        return self.dialect.shares_runs

    def secondary(self) -> Self:
        """Another connection to the same checked database, for a thread of our own,
        working under the same worker lease."""
        store = type(self)(self.engine.secondary())
        store.worker_id = self.worker_id
        return store

    def close(self) -> None:
        self.engine.close()

    def check_invariants(self) -> None:
        """Refuse a database whose rows contradict each other (checks.py), as every open
        does before anything is written."""
        Checks(self.engine).check_invariants()


__all__ = [
    "ATTENTION_STATES",
    "DatabaseUnwritable",
    "LeaseHeld",
    "LeaseLost",
    "LostRace",
    "NoDatabase",
    "NotADatabasePath",
    "PlanRefused",
    "PlanStage",
    "Prior",
    "RunExists",
    "StorageFailed",
    "Store",
    "StoreRefused",
    "Target",
    "parse_target",
]
