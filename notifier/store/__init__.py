"""The receipts store, split along its seams: opening and checks (opening.py for an SQLite
file, postgres.py for a PostgreSQL server; checks.py for both), the ledger of writes
(ledger.py) and of drafts (drafts.py), leases (leases.py) and queries (queries.py), over one
shared core (core.py). `Store` is their union and `Store.open(target)` picks the engine.
All SQL lives in this package."""

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
from .history import Prior
from .leases import Leases
from .opening import Opening
from .queries import Queries
from .stage import PlanStage
from .target import is_postgres


class Store(Drafts, Leases, Queries, Buckets, Checks):
    """One receipts database: `Store.open(target)`, where the target is a path (SQLite, the
    embedded default) or a postgresql:// URL."""

    @classmethod
    def open(cls, path: Path | str, *, create: bool = False, readonly: bool = False) -> Store:
        if is_postgres(path):
            # psycopg only when a server is named (see postgres_store.py).
            from .postgres_store import PostgresStore  # noqa: PLC0415

            return PostgresStore.open(path, create=create, readonly=readonly)
        return SqliteStore.open(Path(path), create=create, readonly=readonly)

    def secondary(self) -> Self:
        """Another connection to the same checked database, for a thread of our own."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SqliteStore(Opening, Store):
    """A receipts database in one SQLite file."""


__all__ = [
    "ATTENTION_STATES",
    "DatabaseUnwritable",
    "LeaseHeld",
    "LeaseLost",
    "LostRace",
    "NoDatabase",
    "PlanRefused",
    "PlanStage",
    "Prior",
    "RunExists",
    "SqliteStore",
    "StorageFailed",
    "Store",
    "StoreRefused",
    "is_postgres",
]
