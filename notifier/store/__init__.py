"""The receipts store, split along its seams: one engine per database (backend.py: the
protocol and the dialect record; sqlite.py for an SQLite file, postgres.py for a PostgreSQL
server), the checks every open runs (checks.py, both engines), and the store's parts, each
an object holding the one core (core.py: the write transaction and its fence, events, the
conditional moves): the plan (plans.py, over history.py and suppressions.py), the ledger
of writes (ledger.py), drafts and chunks (drafts.py, chunks.py), leases (leases.py), queries
(queries.py) and rate buckets (buckets.py). No part inherits from another; one that needs
another is handed it. `Store` composes them over one engine, its fencing (the run's lease,
or one worker's) fixed when it is made. target.py parses --db once into a Target (an SQLite
file or a PostgreSQL URL), which opens the store of its engine; the schema and its
migrations are migrations.py's. Every statement the parts send is named in statements/,
one module per part, written once for both engines and compiled by each into its driver's
own form. All SQL lives in this package."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Self

from notifier.domain.chain import UNKEYED, Signer
from notifier.store.audit import AuditRecords
from notifier.store.backend import Engine
from notifier.store.buckets import Buckets
from notifier.store.checks import Checks
from notifier.store.chunks import Chunks
from notifier.store.core import RUN_FENCE, Core, Fencing, RunFence, WorkerFence
from notifier.store.drafts import Drafts
from notifier.store.exceptions import (
    DatabaseUnwritable,
    LeaseHeld,
    LeaseLost,
    LossCause,
    LostRace,
    NoDatabase,
    PlanRefused,
    ReadRaced,
    RunExists,
    StorageFailed,
    StoreRefused,
)
from notifier.store.history import RowHistory
from notifier.store.leases import Adopted, Leases
from notifier.store.ledger import Ledger
from notifier.store.plans import Planning
from notifier.store.prior import Prior
from notifier.store.queries import Queries
from notifier.store.stage import PlanStage
from notifier.store.statements import ATTENTION_STATES
from notifier.store.suppressions import Suppressions
from notifier.store.target import NotADatabasePath, Target
from notifier.store.target import parse as parse_target


class Store:
    """One receipts database: `Store.open(db)`, where `db` is a path (SQLite, the embedded
    default), a postgresql:// URL, or the Target either parses to; the store over that
    target's engine.

    Its parts, each an object over the one `core` (core.py: the write transaction, the
    fence, events, the conditional moves and the run rows: `core.get_run`, `core.runs`):

    - `plans`: storing a plan (plans.py), over `history` (what earlier runs did with
      its rows: history.py) and `suppressions` (the suppression list: suppressions.py);
    - `ledger`: every write of a run's history once planned (ledger.py);
    - `drafts` and `chunks`: a --compose run's drafts and its Batch API chunks;
    - `leases`: the run's lease and the worker leases (leases.py);
    - `queries`: reading runs, items and their history (queries.py);
    - `buckets`: the --rate buckets the workers of a run share (buckets.py).

    Its fencing is fixed when it is made: by the run's lease, or, from `for_worker`, by one
    worker's own lease; nothing changes it afterwards."""

    def __init__(self, engine: Engine, fencing: Fencing = RUN_FENCE) -> None:
        self.engine = engine
        self.core = core = Core(engine, fencing)
        self.history = RowHistory(core)
        self.suppressions = Suppressions(core)
        self.plans = Planning(core, self.history, self.suppressions)
        self.ledger = Ledger(core, self.suppressions)
        self.drafts = Drafts(core, self.plans)
        self.chunks = Chunks(core)
        self.leases = Leases(core)
        self.queries = Queries(core)
        self.buckets = Buckets(core)
        self.audit = AuditRecords(core)

    @classmethod
    def open(
        cls,
        db: Path | str | Target,
        *,
        create: bool = False,
        readonly: bool = False,
        signer: Signer = UNKEYED,
        audited: bool = False,
    ) -> Self:
        """The checked store (StoreRefused, NoDatabase, …): nothing is written to a database
        that fails the checks, nor with `readonly`. `signer` links the events it writes
        (chain.py: the process's audit key, or none). `audited` (with `readonly`): a
        database whose rows contradict each other is opened anyway, for `verify` to name
        what was altered rather than refuse to look."""
        target = parse_target(db) if isinstance(db, Path | str) else db
        engine = target.engine(create=create, readonly=readonly, audited=audited)
        engine.signer = signer
        return cls(engine)

    @property
    def path(self) -> Path | str:
        """For SQLite the file; for PostgreSQL the server and database (never a password),
        as messages name it."""
        return self.engine.path

    @property
    def fencing(self) -> Fencing:
        """Whose lease fences this store's writes (core.py), as fixed when it was made."""
        return self.core.fencing

    @property
    def shares_runs(self) -> bool:
        """Whether many processes may work one run at once, each under a worker lease of its
        own (lease.for_sending picks the lease by it); the engine's answer, as its Target's."""
        return self.engine.dialect.shares_runs

    def for_worker(self, worker_id: str) -> Self:
        """This store, over the same connection, fenced by the worker lease `worker_id`:
        its writes abort once that lease moved on, and its claims record the worker. This
        store keeps its own fencing; the two share one connection, so close only this one."""
        return type(self)(self.engine, WorkerFence(worker_id))

    def secondary(self) -> Self:
        """Another connection to the same checked database, for a thread of our own, fenced
        as this store is."""
        return type(self)(self.engine.secondary(), self.core.fencing)

    def reading(self) -> AbstractContextManager[None]:
        """Reads that see one committed state, for readers outside the store
        (notifier/observe/metrics.py): the figures of one scrape all come from one state."""
        return self.core.snapshot()

    def close(self) -> None:
        self.engine.close()

    def check_invariants(self) -> None:
        """Refuse a database whose rows contradict each other (checks.py), as every open
        does before anything is written."""
        Checks(self.engine).check_invariants()


__all__ = [
    "ATTENTION_STATES",
    "Adopted",
    "DatabaseUnwritable",
    "LeaseHeld",
    "LeaseLost",
    "LossCause",
    "LostRace",
    "NoDatabase",
    "NotADatabasePath",
    "PlanRefused",
    "PlanStage",
    "Prior",
    "ReadRaced",
    "RunExists",
    "RunFence",
    "StorageFailed",
    "Store",
    "StoreRefused",
    "Target",
    "WorkerFence",
    "parse_target",
]
