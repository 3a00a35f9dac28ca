"""A private scratch database where a batch is validated and digested row by row before
anything touches the receipts database (streaming plan)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from notifier.store.pids import pid_exists

# `row_digest`: a row with an `id`, its row digest where that is not its intent digest
# (make_plan): the identity an id-less row of its content has whatever its deadline or line
# breaks, under which it is compared with earlier rows and later rows with it (m022).
_ITEM_COLUMNS = (
    "seq, item_id, channel, target, payload, idempotency_key, intent_digest, not_after, identity, "
    "not_before, send_window, send_tz, row_digest"
)
# The stage's own rows also keep the CSV line each came from, to name it in a refusal.
_STAGE_COLUMNS = f"{_ITEM_COLUMNS}, line"
# What a comparison reads of the stage (statements.history._keyed); PostgreSQL copies these.
_COMPARED_COLUMNS = _ITEM_COLUMNS
# A newly planned item: its run, the item columns, then the rest, all `pending` and unattempted.
_PENDING_COLUMNS = f"run_id, {_ITEM_COLUMNS}, updated_at, state, attempts"


class PlanStage:
    """A plan's intents while the CSV streams in, before anything is stored.

    A private scratch database (a temporary file, deleted when closed), so
    memory stays flat whatever the size of the batch, and the receipts database is not touched
    until the whole file has passed: a bad last row leaves it exactly as it was (or absent).
    It also holds every item id seen, which finds duplicates without a Python set of a
    million ids. Store.create_run copies its rows inside its one transaction (SQLite
    attaches the file; PostgreSQL reads it a chunk at a time into COPY)."""

    CHUNK = 5000
    PREFIX = "notifier-plan-"

    def __init__(self) -> None:
        # A file of its own in a private (0700) directory, so that the receipts database
        # can attach it and copy the rows itself; removed on close. Named after this
        # process, so that the next plan can remove one a kill -9 left behind: it holds
        # every recipient and payload of a batch.
        _remove_abandoned(Path(tempfile.gettempdir()), self.PREFIX)
        self._dir = Path(tempfile.mkdtemp(prefix=f"{self.PREFIX}{os.getpid()}-"))
        self.path = self._dir / "stage.db"
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        # Scratch: nothing here must survive a crash, so no journal and no fsync.
        self.conn.execute("PRAGMA journal_mode = OFF")
        self.conn.execute("PRAGMA synchronous = OFF")
        self.conn.execute(
            "CREATE TABLE ids (item_id TEXT PRIMARY KEY, line INTEGER NOT NULL) WITHOUT ROWID"
        )
        self.conn.execute(
            "CREATE TABLE items (seq INTEGER PRIMARY KEY, item_id TEXT, channel TEXT, "
            "target TEXT, payload TEXT, idempotency_key TEXT, intent_digest TEXT, not_after TEXT, "
            "identity TEXT, not_before TEXT, send_window TEXT, send_tz TEXT, line INTEGER, "
            "row_digest TEXT)"
        )
        self.conn.execute("BEGIN")  # one scratch transaction: no commit per chunk
        self._buffer: list[tuple[Any, ...]] = []
        self._noted: list[tuple[str, int]] = []
        self.count = 0

    def note(self, item_id: str, line: int) -> None:
        """Remember that `line` uses `item_id` (checked with the rest of its chunk)."""
        self._noted.append((item_id, line))

    def duplicates(self) -> list[tuple[int, str, int]]:
        """(line, id, first line) for each id noted since the last call that an earlier line
        used. One INSERT for the chunk; only a chunk that holds a duplicate (the file will
        be refused) is looked at row by row."""
        noted, self._noted = self._noted, []
        before = self.conn.total_changes
        self.conn.executemany(
            "INSERT INTO ids (item_id, line) VALUES (?, ?) ON CONFLICT DO NOTHING", noted
        )
        if self.conn.total_changes - before == len(noted):
            return []
        found = []
        for item_id, line in noted:
            (first,) = self.conn.execute(
                "SELECT line FROM ids WHERE item_id = ?", (item_id,)
            ).fetchone()
            if first != line:
                found.append((line, item_id, int(first)))
        return found

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
        identity: str | None,
        when: tuple[str | None, str | None, str | None] = (None, None, None),
        line: int | None = None,
        row_digest: str | None = None,
    ) -> None:
        """`when`: not_before, send_window, send_tz (schema_sqlite.M009); `line`: the CSV
        line of the row (None for rows that come from no file line, such as drafts);
        `row_digest`: see _STAGE_COLUMNS."""
        self._buffer.append(
            (seq, item_id, channel, target, payload, key, digest, not_after, identity, *when,
             row_digest, line)
        )  # fmt: skip
        self.count += 1
        if len(self._buffer) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self.conn.executemany(
                f"INSERT INTO items ({_STAGE_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self._buffer,
            )
            self._buffer.clear()

    def identical_lines(self) -> Iterator[tuple[int, int]]:
        """(line, first line) for each staged row, after the first, whose identity (channel
        plus `items.identity`) an earlier line has too: one set-based pass, no Python set of
        a million identities. Rows with their own `id` never match (ids are checked apart)."""
        self._flush()
        yield from self.conn.execute(
            "SELECT s.line, f.first FROM items s JOIN ("
            "  SELECT channel, identity, MIN(line) AS first FROM items"
            "  WHERE identity NOT LIKE 'id:%' GROUP BY channel, identity HAVING COUNT(*) > 1"
            ") f ON s.channel = f.channel AND s.identity = f.identity "
            "WHERE s.line > f.first ORDER BY s.line"
        )

    def finish(self) -> None:
        """Every intent written and committed, for another connection to read."""
        self._flush()
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")

    def rows(self, columns: str = _ITEM_COLUMNS) -> Iterator[tuple[Any, ...]]:
        """Every staged intent in seq order (`columns` of it), read a chunk at a time."""
        self._flush()
        cursor = self.conn.execute(f"SELECT {columns} FROM items ORDER BY seq")
        while chunk := cursor.fetchmany(self.CHUNK):
            yield from chunk

    def close(self) -> None:
        self.conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# A stage whose process is gone and which nothing has written for this long was abandoned
# (the age guards against a pid seen from another pid namespace sharing /tmp).
ABANDONED_AFTER_S = 3600


def _remove_abandoned(where: Path, prefix: str) -> None:
    """Remove the stages of plans whose process died before closing them (kill -9, power
    loss): this user's `PREFIX<pid>-…` directories whose pid is gone, untouched for an hour."""
    for stage in where.glob(f"{prefix}*-*"):
        pid_text = stage.name.removeprefix(prefix).split("-", 1)[0]
        if not (pid_text.isascii() and pid_text.isdigit()) or pid_exists(int(pid_text)):
            continue
        try:
            info = stage.stat()
            if info.st_uid != os.getuid():
                continue
            newest = max([info.st_mtime, *(f.stat().st_mtime for f in stage.iterdir())])
            if time.time() - newest < ABANDONED_AFTER_S:
                continue
        except OSError:
            continue  # gone meanwhile, or not ours to look into
        shutil.rmtree(stage, ignore_errors=True)
