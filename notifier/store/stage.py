"""A private scratch database where a batch is validated and digested row by row before
anything touches the receipts database (streaming plan)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

from .core import _ITEM_COLUMNS


class PlanStage:
    """A plan's intents while the CSV streams in, before anything is stored.

    A private scratch database (SQLite makes it a temporary file, deleted when closed), so
    memory stays flat whatever the size of the batch, and the receipts database is not touched
    until the whole file has passed: a bad last row leaves it exactly as it was (or absent).
    It also holds every item id seen, which finds duplicates without a Python set of a
    million ids. Store.create_run copies its rows in chunks inside its one transaction."""

    CHUNK = 5000

    def __init__(self) -> None:
        self.conn = sqlite3.connect("", isolation_level=None)
        # Scratch: nothing here must survive a crash, so no journal and no fsync.
        self.conn.execute("PRAGMA journal_mode = OFF")
        self.conn.execute("PRAGMA synchronous = OFF")
        self.conn.execute(
            "CREATE TABLE ids (item_id TEXT PRIMARY KEY, line INTEGER NOT NULL) WITHOUT ROWID"
        )
        self.conn.execute(
            "CREATE TABLE items (seq INTEGER PRIMARY KEY, item_id TEXT, channel TEXT, "
            "target TEXT, payload TEXT, idempotency_key TEXT, intent_digest TEXT, not_after TEXT)"
        )
        self.conn.execute("BEGIN")  # one scratch transaction: no commit per chunk
        self._buffer: list[tuple[Any, ...]] = []
        self.count = 0

    def first_use(self, item_id: str, line: int) -> int | None:
        """None the first time `item_id` is seen (it is noted with `line`); after that, the
        line that used it first."""
        cursor = self.conn.execute(
            "INSERT INTO ids (item_id, line) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (item_id, line),
        )
        if cursor.rowcount == 1:
            return None
        (first,) = self.conn.execute(
            "SELECT line FROM ids WHERE item_id = ?", (item_id,)
        ).fetchone()
        return int(first)

    def add(
        self,
        seq: int,
        item_id: str,
        channel: str,
        target: str,
        payload: str,
        key: str,
        digest: str,
        not_after: str | None,
    ) -> None:
        self._buffer.append((seq, item_id, channel, target, payload, key, digest, not_after))
        self.count += 1
        if len(self._buffer) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self.conn.executemany(
                f"INSERT INTO items ({_ITEM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                self._buffer,
            )
            self._buffer.clear()

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Every staged intent in seq order, read a chunk at a time."""
        self._flush()
        cursor = self.conn.execute(f"SELECT {_ITEM_COLUMNS} FROM items ORDER BY seq")
        while chunk := cursor.fetchmany(self.CHUNK):
            yield from chunk

    def close(self) -> None:
        self.conn.close()
