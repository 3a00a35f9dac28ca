"""The store's failures, each a NotifierError carrying its exit code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import clock
from ..errors import BadInput, NeedsAttention, Refused

if TYPE_CHECKING:
    from .prior import Prior


class StoreRefused(Refused):
    """The file is not a database this version may touch; it has not been modified."""


class NoDatabase(BadInput):
    """There is no database yet (a read-only command was run before any send)."""


class DatabaseUnwritable(BadInput):
    """The database (or its directory) cannot be written; nothing was changed."""


class StorageFailed(NeedsAttention):
    """The database could not be written (disk full, I/O error, locked too long). The write
    was rolled back whole; everything committed before it is safe."""


class WriteConflict(StorageFailed):
    """The server aborted the transaction to break a deadlock with another writer (or a
    serialization conflict): nothing of it was written, and it may simply run again
    (core.retried). Raised past the retries, it is a StorageFailed like any other."""


class LostRace(Refused):
    """A conditional UPDATE matched nothing: someone else moved the row first."""


class LeaseLost(Refused):
    """Another process took over the run; this worker must stop without writing."""

    def __str__(self) -> str:
        return f"{super().__str__()}; this process stopped without writing."


class PlanRefused(BadInput):
    """Rows of the plan are open in another run, may have been delivered, or were delivered
    with other content (`prior` says which); nothing was stored."""

    def __init__(self, prior: Prior) -> None:
        self.prior = prior
        super().__init__("rows of this batch are held by earlier runs")


class RunExists(BadInput):
    """A run with this id is already in the database."""


class LeaseHeld(Refused):
    def __init__(self, owner: dict[str, Any], expires_at: str | None) -> None:
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(
            f"held by pid {owner.get('pid')} on {owner.get('host')} until {clock.local(expires_at)}"
        )
