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
never deletes or truncates the -shm file, so the mapping stays valid. And only a -shm that
SQLite itself holds open in this process is watched: a file in the wrong place would never
change.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

_HEADER_BYTES = 96  # both copies of the header
_WALINDEX_VERSION = 3007000  # the only wal-index format SQLite has shipped since 3.7.0

FileKey = tuple[int, int]  # st_dev, st_ino of the database file


class WalIndexWatch:
    """A read-only view of one database's wal-index header."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._map = mapping
        version, _unused, _change, initialised = struct.unpack_from("=IIIB", mapping, 0)
        # A header this code knows how to read; otherwise every check asks SQLite.
        self.readable = version == _WALINDEX_VERSION and initialised == 1

    @classmethod
    def open(cls, fd: int) -> WalIndexWatch | None:
        """A view of the -shm file open as `fd`, or None when it cannot be mapped (too
        short: not yet initialised). The mapping holds a duplicate of `fd`, so it too is
        closed only with the file's last connection. (Should mmap itself fail, Python closes
        that duplicate at once; SQLite maps the same file itself, so it cannot fail here for
        a reason SQLite would not have met first.)"""
        try:
            if os.fstat(fd).st_size < _HEADER_BYTES:
                return None
            return cls(mmap.mmap(fd, _HEADER_BYTES, access=mmap.ACCESS_READ))
        except (OSError, ValueError):
            return None

    def marker(self) -> bytes:
        """The header as it is now: equal to an earlier marker only if no transaction has
        committed in between (a checkpoint's restart of the WAL changes it too)."""
        return self._map[:_HEADER_BYTES]

    def close(self) -> None:
        self._map.close()


@dataclass
class _File:
    """One database file as this process has it open."""

    shm: Path  # where SQLite keeps its -shm (named when the first connection opened)
    connections: int = 0
    tried: bool = False  # the watch is opened once, on first use
    fd: int = -1  # the -shm's descriptor, kept until the last connection closes
    watch: WalIndexWatch | None = None  # None: not SQLite's -shm, or not mappable


class _Registry:
    """This process's connections to each database file, and the one watch of each. Every
    descriptor of a -shm file opened here (the watch's, and the duplicate its mapping holds)
    is closed only when the file's last connection has closed (see the module's note)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[FileKey, _File] = {}

    def connected(self, key: FileKey, database: Path) -> None:
        with self._lock:
            self._files.setdefault(key, _File(_shm_of(database))).connections += 1

    def disconnected(self, key: FileKey) -> None:
        """After a connection has closed: the last one closes the file's watch too."""
        with self._lock:
            file = self._files.get(key)
            if file is None:
                return
            file.connections -= 1
            if file.connections > 0:
                return
            del self._files[key]
        if file.watch is not None:
            file.watch.close()
        if file.fd >= 0:
            os.close(file.fd)

    def watch(self, key: FileKey) -> WalIndexWatch | None:
        """The file's watch, while a connection to it is open and it can be read."""
        with self._lock:
            file = self._files.get(key)
            if file is None:
                return None
            if not file.tried:
                file.tried = True
                self._open(file)
            return file.watch if file.watch is not None and file.watch.readable else None

    @staticmethod
    def _open(file: _File) -> None:
        try:
            fd = os.open(file.shm, os.O_RDONLY)
        except OSError:
            return
        if not _open_elsewhere_in_this_process(fd):
            # Not the -shm SQLite uses (a stale file beside a link, say): watching it would
            # miss commits. No lock of ours is on it, so closing is safe.
            os.close(fd)
            return
        file.fd = fd
        file.watch = WalIndexWatch.open(fd)


def _shm_of(database: Path) -> Path:
    database = database.resolve()  # SQLite follows links to name the -shm
    return database.with_name(database.name + "-shm")


def _open_elsewhere_in_this_process(fd: int) -> bool:
    """Whether another descriptor of this process (SQLite's) is open on `fd`'s file. Where
    /proc/self/fd cannot say (not Linux), no: the checks ask SQLite."""
    mine = os.fstat(fd)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for name in names:
        if name == str(fd):
            continue
        try:
            other = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (mine.st_dev, mine.st_ino):
            return True
    return False


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
