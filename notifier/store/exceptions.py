"""The store's failures, each a NotifierError carrying its exit code."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from notifier.domain import clock
from notifier.domain.errors import BadInput, NeedsAttention, Refused

if TYPE_CHECKING:
    from notifier.store.prior import Prior


class StoreRefused(Refused):
    """The file is not a database this version may touch; it has not been modified."""


class NoDatabase(BadInput):
    """There is no database yet (a read-only command was run before any send)."""


class DatabaseUnwritable(BadInput):
    """The database (or its directory) cannot be written; nothing was changed."""


class DatabaseDamaged(Refused):
    """A stored value no version of notifier writes (SQLite text that is not UTF-8): the file
    was damaged on disk or changed outside notifier. Refused for safety; nothing changed."""


class StorageFailed(NeedsAttention):
    """The database could not be written (disk full, I/O error, locked too long). The write
    was rolled back whole; everything committed before it is safe."""


class ReadRaced(NeedsAttention):
    """A read-only command read an SQLite file without SQLite's locks (`immutable`: no
    process had it open) and another process wrote into it meanwhile, so what the command
    read may mix two moments of the database. Nothing was changed; the same command, run
    again, reads the file as it is now."""


class WriteConflict(StorageFailed):
    """The server aborted the transaction to break a deadlock with another writer (or a
    serialization conflict): nothing of it was written, and it may simply run again
    (core.retried). Raised past the retries, it is a StorageFailed like any other."""


class LostRace(Refused):
    """A conditional UPDATE matched nothing: someone else moved the row first."""


class LossCause(StrEnum):
    """Why a process no longer holds its lease, as its message says it."""

    # The lease's version moved (reaped, or taken): another process holds the run now.
    TAKEN_OVER = "another process took over this run"
    # Not renewed for too long while this process was not running (stopped, stalled): it can
    # no longer prove it holds the run, whether or not anyone has taken it since.
    STALE = (
        "its lease went stale while this process was not running (not renewed for longer "
        "than a send may trust it), so it can no longer prove it holds the run"
    )
    # The heartbeat could not go on renewing it (no connection of its own, a failure, or
    # renewals failing until it went stale while this process was running).
    UNKEPT = (
        "its heartbeat could not keep its lease renewed (the database was busy or out of "
        "reach), so it can no longer prove it holds the run"
    )
    # The server ended the session of a write transaction left idle too long (postgres.py).
    SESSION_ENDED = (
        "this process was stopped inside a write transaction for so long that the server "
        "ended its session (nothing of that transaction was written)"
    )


class LeaseLost(Refused):
    """This process no longer holds its lease (`cause`); it must stop without writing."""

    def __init__(self, message: str, cause: LossCause = LossCause.TAKEN_OVER) -> None:
        super().__init__(message)
        self.cause = cause

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


class AuditKeyMismatch(Refused):
    """A run's events are keyed with one audit key and this process holds another, or none:
    writing on would break the run's chain, so nothing was written."""
