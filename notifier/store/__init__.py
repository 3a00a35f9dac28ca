"""The SQLite store, split along its seams: opening and checks (opening.py), the ledger of
writes (ledger.py) and of drafts (drafts.py), leases (leases.py) and queries (queries.py),
over one shared core (core.py). `Store` is their union; the next backend implements the same
seams. All SQL lives in this package."""

from __future__ import annotations

from .core import ATTENTION_STATES
from .drafts import Drafts
from .exceptions import (
    AlreadyPlanned,
    DatabaseUnwritable,
    LeaseHeld,
    LeaseLost,
    LostRace,
    NoDatabase,
    RunExists,
    StorageFailed,
    StoreRefused,
)
from .leases import Leases
from .opening import Opening
from .queries import Queries
from .stage import PlanStage


class Store(Opening, Drafts, Leases, Queries):
    """One receipts database: open it with `Store.open(path)`."""


__all__ = [
    "ATTENTION_STATES",
    "AlreadyPlanned",
    "DatabaseUnwritable",
    "LeaseHeld",
    "LeaseLost",
    "LostRace",
    "NoDatabase",
    "PlanStage",
    "RunExists",
    "StorageFailed",
    "Store",
    "StoreRefused",
]
