"""Seeing that nobody has committed to an SQLite file since a moment, without calling SQLite.

In WAL mode every commit, by any connection of any process, rewrites the wal-index header
at the start of the `-shm` file: two 48-byte copies holding a change counter incremented by
each transaction, the last frame, salts and a checksum (SQLite's file format, "WAL-Index
Format"). SQLite itself compares this header with the one it last saw to learn whether its
snapshot is stale, which is what `PRAGMA data_version` reports. Reading the same bytes from a
read-only shared mapping costs no system call and, unlike any query, never lets go of the
GIL: 16 sender threads checking the cancel flag before each send no longer queue for it.

Closing ANY descriptor of a file drops every POSIX lock this process holds on it, SQLite's
included (its read, write and "still in use" locks on the -shm live there). So the watch's
descriptor is closed only once this process has no connection left to the database: SQLite
has then let go of its locks itself. Every connection to a receipts database is made by
store/opening.py, which reports each one opened and closed here. While one is open, SQLite
never deletes or truncates the -shm file, so the mapping stays valid.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from pathlib import Path

_HEADER_BYTES = 96  # both copies of the header
_WALINDEX_VERSION = 3007000  # the only wal-index format SQLite has shipped since 3.7.0

FileKey = tuple[int, int]  # st_dev, st_ino of the database file


class WalIndexWatch:
    """A read-only view of one database's wal-index header."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._map = mapping

    @classmethod
    def open(cls, fd: int) -> WalIndexWatch | None:
        """The watch of the -shm file open as `fd`, or None when it holds no header this
        code can read (not yet initialised, an unknown version): then every check asks
        SQLite, as before. The mapping holds a duplicate of `fd` (closed with it)."""
        try:
            if os.fstat(fd).st_size < _HEADER_BYTES:
                return None
            mapping = mmap.mmap(fd, _HEADER_BYTES, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        version, _unused, _change, initialised = struct.unpack_from("=IIIB", mapping, 0)
        if version != _WALINDEX_VERSION or initialised != 1:
            mapping.close()  # only once no connection is left: see _Registry.disconnected
            return None
        return cls(mapping)

    def marker(self) -> bytes:
        """The header as it is now: equal to an earlier marker only if no transaction has
        committed in between (a checkpoint's restart of the WAL changes it too)."""
        return self._map[:_HEADER_BYTES]

    def close(self) -> None:
        self._map.close()


class _Registry:
    """This process's connections to each database file, and the one watch of each. Every
    descriptor of a -shm file opened here (the watch's, and the duplicate its mapping holds)
    is closed only when the file's last connection has closed (see the module's note)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[FileKey, int] = {}
        # Per file: the descriptor of its -shm and its watch (None: none readable).
        self._watches: dict[FileKey, tuple[int, WalIndexWatch | None]] = {}

    def connected(self, key: FileKey) -> None:
        with self._lock:
            self._connections[key] = self._connections.get(key, 0) + 1

    def disconnected(self, key: FileKey) -> None:
        """After a connection has closed: the last one closes the file's watch too."""
        with self._lock:
            left = self._connections.pop(key, 0) - 1
            if left > 0:
                self._connections[key] = left
                return
            fd, watch = self._watches.pop(key, (-1, None))
        if watch is not None:
            watch.close()
        if fd >= 0:
            os.close(fd)

    def watch(self, key: FileKey, database: Path) -> WalIndexWatch | None:
        """The file's watch, opened on first use (tried once per file while connected);
        only while a connection to it is open."""
        with self._lock:
            if not self._connections.get(key):
                return None
            if key not in self._watches:
                try:
                    fd = os.open(database.with_name(database.name + "-shm"), os.O_RDONLY)
                except OSError:
                    return None
                self._watches[key] = (fd, WalIndexWatch.open(fd))
            return self._watches[key][1]


_registry = _Registry()
connected = _registry.connected
disconnected = _registry.disconnected
watch = _registry.watch


def file_key(path: Path) -> FileKey | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
