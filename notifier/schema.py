"""The database schema as numbered migrations. A shipped migration is never edited: a change
is a new `@migration` function `mNNN_…` appended below.

sqlite-utils applies them, and records each in its own table. Every open reads that record
with plain SQL, and sqlite-utils is imported only when a migration is pending: loading it
costs every command start-up time, and a read-only command never migrates."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlite_utils import Database

# Stamped into the SQLite header (PRAGMA application_id) so a foreign database is recognised
# before anything is read from its tables. "NTFR" in ASCII.
APPLICATION_ID = 0x4E544652
MIGRATION_SET = "notifier"
# Where sqlite-utils records which migrations were applied (columns migration_set, name,
# applied_at): its Migrations.migrations_table, as a test pins.
MIGRATIONS_TABLE = "_sqlite_migrations"

Migration = Callable[["Database"], None]

# Every migration, in the order they apply; each is named by its function.
MIGRATIONS: list[Migration] = []


def migration(function: Migration) -> Migration:
    """Append `function` to MIGRATIONS."""
    MIGRATIONS.append(function)
    return function


def applied(conn: sqlite3.Connection) -> set[str]:
    """The names of the migrations applied to `conn`'s database, as sqlite-utils recorded
    them (none when it never applied one)."""
    if not conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MIGRATIONS_TABLE,)
    ).fetchone():
        return set()
    return {
        name
        for (name,) in conn.execute(
            f"SELECT name FROM {MIGRATIONS_TABLE} WHERE migration_set = ?", (MIGRATION_SET,)
        )
    }


def apply(conn: sqlite3.Connection) -> None:
    """Apply the migrations `conn`'s database lacks, in order, with sqlite-utils: each in a
    transaction together with its record."""
    done = applied(conn)
    if all(m.__name__ in done for m in MIGRATIONS):
        return
    from sqlite_utils import Database, Migrations  # noqa: PLC0415 - only when one is pending

    migrations = Migrations(MIGRATION_SET)
    for function in MIGRATIONS:
        migrations()(function)
    migrations.apply(Database(conn))


@migration
def m001_initial(db: Database) -> None:
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    _execute_all(db, _M001)


def _execute_all(db: Database, script: str) -> None:
    """The statements of `script`, one `;` at a line's end apart, in order."""
    for statement in script.split(";\n"):
        if statement.strip():
            db.execute(statement)


_M001 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    batch_path TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    channel_snapshot TEXT NOT NULL,
    options TEXT NOT NULL,
    contract_version TEXT NOT NULL,
    lease_owner TEXT,
    lease_version INTEGER NOT NULL DEFAULT 0,
    lease_expires_at TEXT,
    cancel_requested_at TEXT,
    approval TEXT,
    paused_until TEXT,
    stop_reason TEXT
);
CREATE INDEX runs_fingerprint ON runs(fingerprint);
CREATE TABLE items (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    target TEXT NOT NULL,
    payload TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    intent_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT,
    receipt_id TEXT,
    last_error TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, item_id)
);
CREATE INDEX items_active ON items(run_id, seq)
    WHERE state IN ('pending', 'in_flight', 'unknown');
CREATE TABLE attempts (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    n INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    outcome TEXT,
    http_status INTEGER,
    error TEXT,
    waited_s REAL,
    retry_after_s REAL,
    FOREIGN KEY (run_id, seq) REFERENCES items(run_id, seq),
    UNIQUE (run_id, seq, n)
);
CREATE INDEX attempts_open ON attempts(run_id, seq) WHERE finished_at IS NULL;
CREATE TABLE receipts (
    idempotency_key TEXT PRIMARY KEY REFERENCES items(idempotency_key),
    intent_digest TEXT NOT NULL,
    receipt_id TEXT,
    source TEXT NOT NULL,
    evidence TEXT,
    recorded_at TEXT NOT NULL
);
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq_no INTEGER NOT NULL,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    item_seq INTEGER,
    detail TEXT,
    PRIMARY KEY (run_id, seq_no)
);
CREATE TABLE decisions (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    operator TEXT NOT NULL,
    at TEXT NOT NULL,
    decision TEXT NOT NULL,
    evidence TEXT NOT NULL,
    FOREIGN KEY (run_id, seq) REFERENCES items(run_id, seq)
);
"""


@migration
def m002_key_nonce_content_fingerprint(db: Database) -> None:
    """Issue 7, points 3 and 4: a per-run key nonce, and the content fingerprint that decides
    "already planned" (ordered intent digests + channel names, no transport tuning).

    Old runs keep their keys (keys are stored, never recomputed), so their nonce stays NULL.
    Their content fingerprint is back-filled from their stored items so that an old run
    still blocks a re-send of the same batch. The formula is written out here rather than
    imported, because a shipped migration must not change when intent.py does; it equals
    intent.content_fingerprint (a test pins that)."""
    db.execute("ALTER TABLE runs ADD COLUMN key_nonce TEXT")
    db.execute("ALTER TABLE runs ADD COLUMN content_fingerprint TEXT")
    run_ids = [row[0] for row in db.execute("SELECT run_id FROM runs")]
    for run_id in run_ids:
        db.execute(
            "UPDATE runs SET content_fingerprint = ? WHERE run_id = ?",
            (stored_content_fingerprint(db.conn, run_id), run_id),
        )
    db.execute("CREATE INDEX runs_content_fingerprint ON runs(content_fingerprint)")


def stored_content_fingerprint(conn: Any, run_id: str) -> str:
    """The content fingerprint of a run, from its stored items (for m002's back-fill on
    either engine, and
    for a read-only look at a database m002 has not been applied to yet)."""
    h = hashlib.sha256()
    channels: set[str] = set()
    for digest, channel in conn.execute(
        "SELECT intent_digest, channel FROM items WHERE run_id = ? ORDER BY seq", (run_id,)
    ):
        h.update(digest.encode("ascii"))
        h.update(b"\n")
        channels.add(channel)
    names = json.dumps(sorted(channels), separators=(",", ":"), ensure_ascii=False)
    h.update(unicodedata.normalize("NFC", names).encode("utf-8"))
    return "sha256:" + h.hexdigest()


@migration
def m003_deadlines_and_drafts(db: Database) -> None:
    """Item deadlines (`not_after`, also inside the digested payload; the column only lets a
    claim find due deadlines through an index) and Claude drafts, stored per row before the
    intents are computed, so a resumed run never asks for a draft twice."""
    for statement in _M003.split(";\n"):
        if statement.strip():
            db.execute(statement)


_M003 = """
ALTER TABLE items ADD COLUMN not_after TEXT;
CREATE INDEX items_deadline ON items(run_id, not_after)
    WHERE state = 'pending' AND not_after IS NOT NULL;
CREATE TABLE drafts (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq INTEGER NOT NULL,
    line INTEGER NOT NULL,
    source TEXT NOT NULL,
    state TEXT NOT NULL,
    subject TEXT,
    body TEXT,
    model TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    error TEXT,
    drafted_at TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX drafts_pending ON drafts(run_id, seq) WHERE state = 'pending'
"""


@migration
def m004_counts_and_attention_indexes(db: Database) -> None:
    """Issue 8, point 4: the cost of `status`, `resume`, `cancel` and `runs` depends on the
    items that need attention, never on the size of the run.

    `run_counts` holds, per run and state, how many items are in it. Triggers on `items` keep
    it in the same transaction as every state move, whichever code path makes the move, so
    the counts cannot drift from the rows; existing runs are back-filled here. Inserts are
    counted by the one function that inserts items (Store._insert_items), once per plan: a
    trigger firing a million times would add a third to planning a million rows. The partial
    indexes let every start-up and report query read only the rows it is about (retried,
    waiting, throttled, in flight, unknown, failed)."""
    # Separated by blank lines: a trigger's body holds ";" of its own, and SQLite reads a
    # CREATE TRIGGER as complete only with the ";" after its END.
    for statement in _M004.split(";\n\n"):
        if statement.strip():
            db.execute(statement.strip().rstrip(";") + ";")


_M004 = """
CREATE TABLE run_counts (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (run_id, state)
) WITHOUT ROWID;

INSERT INTO run_counts (run_id, state, n)
    SELECT run_id, state, COUNT(*) FROM items GROUP BY run_id, state;

CREATE TRIGGER items_count_move AFTER UPDATE OF state ON items
    WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE run_counts SET n = n - 1 WHERE run_id = OLD.run_id AND state = OLD.state;
    INSERT INTO run_counts (run_id, state, n) VALUES (NEW.run_id, NEW.state, 1)
        ON CONFLICT (run_id, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER items_count_delete AFTER DELETE ON items BEGIN
    UPDATE run_counts SET n = n - 1 WHERE run_id = OLD.run_id AND state = OLD.state;
END;

CREATE INDEX items_attention ON items(run_id, state, seq)
    WHERE state IN ('in_flight', 'unknown', 'failed');

CREATE INDEX items_retried ON items(run_id, seq)
    WHERE state = 'pending' AND attempts > 0;

CREATE INDEX items_waiting ON items(run_id, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;

CREATE INDEX items_pending_channel ON items(run_id, channel, next_attempt_at)
    WHERE state = 'pending';

CREATE INDEX attempts_throttled ON attempts(run_id, seq) WHERE outcome = 'throttled';

CREATE INDEX events_disproof ON events(run_id, item_seq)
    WHERE kind IN ('not_found', 'mark_not_sent')
"""


@migration
def m005_workers(db: Database) -> None:
    """Issue 11: many workers on one run (PostgreSQL). Each worker holds a lease row of its
    own (`workers`: host, pid, heartbeat, expiry and a fencing version); a claimed item
    records which worker holds it (`items.worker_id`), so a live worker can settle exactly
    the items of a dead one. `rate_buckets` is a channel's --rate bucket shared by all the
    workers of a run, and `channel_gates` the time until which a throttled answer to any of
    them closed a channel. On SQLite one process works a run, under the run's own lease, as
    before; the tables exist so that both engines keep one schema."""
    _execute_all(db, _M005)


_M005 = """
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    process_start TEXT,
    state TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 1,
    joined_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
CREATE INDEX workers_live ON workers(run_id) WHERE state = 'live';
ALTER TABLE items ADD COLUMN worker_id TEXT;
CREATE INDEX items_held ON items(run_id, worker_id, seq) WHERE state IN ('in_flight', 'unknown');
CREATE TABLE rate_buckets (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    channel TEXT NOT NULL,
    tokens DOUBLE PRECISION NOT NULL,
    refilled_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, channel)
);
CREATE TABLE channel_gates (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    channel TEXT NOT NULL,
    closed_until TEXT NOT NULL,
    PRIMARY KEY (run_id, channel)
)
"""


@migration
def m006_item_identity(db: Database) -> None:
    """Issue 21: a row's identity across runs, so that `send` plans only what earlier runs
    in this database did not deliver. `items.identity` beside `items.channel` is the row's
    own id ("id:" + id) when its file had an id column, else its intent digest (channel,
    normalised recipient and content): intent.row_identity, written out here as SQL.

    Old items are back-filled so that what was delivered before this migration counts. A
    file without an id column gave each row its position as item_id, so a run whose every
    item_id is its seq is taken as such a file. A file whose ids really were 1, 2, 3, … in
    order is read the same way: its rows are then matched by content, and a later copy of
    it with changed content is sent as new rows rather than refused as changed."""
    _execute_all(db, M006)


M006 = """
ALTER TABLE items ADD COLUMN identity TEXT;
UPDATE items SET identity = CASE WHEN run_id IN (
        SELECT run_id FROM items GROUP BY run_id
        HAVING SUM(CASE WHEN item_id = CAST(seq AS TEXT) THEN 0 ELSE 1 END) = 0
    ) THEN intent_digest ELSE 'id:' || item_id END;
CREATE INDEX items_identity ON items(channel, identity)
"""


# ---- m007: issue 24, Message Batches chunks (self-contained: port as one block) ----------


@migration
def m007_draft_chunks(db: Database) -> None:
    """Issue 24: a --compose run drafting through Message Batches keeps one row per chunk,
    an intent like any send's: recorded `creating` (its rows, the digest of its requests, a
    time lower bound) before the batch is created, `submitted` with the batch id after, then
    `done` once its results are stored, or `canceled`. A chunk still `creating` on resume is
    settled by asking the API (batches since `not_before` with `request_count` requests whose
    results carry the chunk's custom_ids), or created again when `recreate` is set."""
    _execute_all(db, M007)


M007 = """
CREATE TABLE draft_chunks (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    chunk INTEGER NOT NULL,
    state TEXT NOT NULL,
    seqs TEXT NOT NULL,
    request_count INTEGER NOT NULL,
    requests_digest TEXT NOT NULL,
    model TEXT NOT NULL,
    not_before TEXT NOT NULL,
    batch_id TEXT,
    recreate INTEGER NOT NULL DEFAULT 0,
    created INTEGER NOT NULL DEFAULT 0,
    note TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run_id, chunk)
);
CREATE INDEX draft_chunks_open ON draft_chunks(run_id, chunk)
    WHERE state IN ('creating', 'submitted')
"""
