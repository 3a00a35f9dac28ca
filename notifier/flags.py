"""The run's flags (its cancel request and lease version) as the database holds them now,
checked before every send without a query whenever nobody has committed since they were
last read.

A check must never answer with flags older than its own start: a cancel committed by anyone
before the check began stops the send. Two ways to know that cheaply:
- `PRAGMA data_version` on one connection changes when another connection has committed,
  so the row is read again only then (FlagReader);
- on SQLite, the wal-index header changes with every commit of anyone (store/walwatch.py).
  The flags read after a marker was taken are still the database's while the header still
  equals that marker (KnownFlags): no query, no system call, the GIL kept.
"""

from __future__ import annotations

from collections.abc import Callable

from .store import Store

Flags = tuple[str | None, int]  # cancel_requested_at, lease_version


class KnownFlags:
    """The flags as last read by any reader of this process, with the commit marker taken
    before that read began; shared by every thread of a run."""

    def __init__(self, marker: Callable[[], bytes] | None) -> None:
        self._marker = marker
        # One tuple, replaced whole: a thread reads the marker and its flags together.
        self._known: tuple[bytes, Flags] | None = None

    @property
    def watching(self) -> bool:
        """Whether the database has a commit marker (SQLite) to hold the flags by."""
        return self._marker is not None

    def current(self) -> Flags | None:
        """The flags, if nobody has committed since the marker taken before their read;
        None when the database must be asked."""
        known = self._known
        if known is not None and self._marker is not None and known[0] == self._marker():
            return known[1]
        return None

    def read_through(self, read: Callable[[], Flags]) -> Flags:
        """`read()`, remembered with the marker taken before it began."""
        if self._marker is None:
            return read()
        marker = self._marker()
        flags = read()
        self._known = (marker, flags)
        return flags


class FlagReader:
    """`run_flags` through one connection, as the database holds them now. The row is read
    again only when another connection (any process) has committed since the last read:
    PRAGMA data_version, taken before the row, says so. A cancel or a takeover committed by
    anyone is never missed, and a check while nothing changed costs one cheap pragma
    instead of a query (the committer's own commits do not count on its own connection),
    or nothing at all while KnownFlags still holds."""

    def __init__(self, store: Store, run_id: str, known: KnownFlags) -> None:
        self.store = store
        self.run_id = run_id
        self.known = known
        self._seen: tuple[int, Flags] | None = None

    def read(self) -> Flags:
        flags = self.known.current()
        if flags is not None:
            return flags
        return self.known.read_through(self._read)

    def _read(self) -> Flags:
        version = self.store.data_version()
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, self.store.run_flags(self.run_id))
        return self._seen[1]
