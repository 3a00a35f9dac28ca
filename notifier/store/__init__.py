"""The receipts store, split along its seams: opening and checks (opening.py for an SQLite
file, postgres.py for a PostgreSQL server; checks.py for both), the ledger of writes
(ledger.py) and of drafts (drafts.py), leases (leases.py) and queries (queries.py), over one
shared core (core.py). `Store` is their union. target.py parses --db once into a Target (an
SQLite file or a PostgreSQL URL), which opens the store of its engine; the schema and its
migrations are migrations.py's. All SQL lives in this package."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Self

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
from .target import NotADatabasePath, Target
from .target import parse as parse_target


class Store(Drafts, Leases, Queries, Buckets, Checks):
    """One receipts database: `Store.open(target)`, where the target is a path (SQLite, the
    embedded default) or a postgresql:// URL."""

    # Whether many processes may work one run at once, each under a worker lease of its own
    # (lease.for_sending picks the lease by it); the engine's answer, as its Target's.
    shares_runs: ClassVar[bool] = False

    @classmethod
    def open(cls, path: Path | str, *, create: bool = False, readonly: bool = False) -> Store:
        return parse_target(path).open(create=create, readonly=readonly)

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
    "NotADatabasePath",
    "PlanRefused",
    "PlanStage",
    "Prior",
    "RunExists",
    "SqliteStore",
    "StorageFailed",
    "Store",
    "StoreRefused",
    "Target",
    "parse_target",
]
