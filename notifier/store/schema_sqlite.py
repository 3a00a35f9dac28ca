"""The SQLite form of each migration's DDL, as shipped: a shipped text is never edited (a
change is a new migration in migrations.py). Statements are one blank line apart, the
separator migrations.py splits on: a trigger's body holds `;` of its own. SQLite keeps each
CREATE's text, up to its `;` or the end of the text, in sqlite_master: where the last
statement has a `;` and where not is as shipped too (migrations.statements says why).

m002 is Python and m006 is the same text on both engines; both live in migrations.py."""

from __future__ import annotations

# Stamped into the SQLite header (PRAGMA application_id) so a foreign database is recognised
# before anything is read from its tables. "NTFR" in ASCII.
APPLICATION_ID = 0x4E544652

# Where the applied migrations are recorded: the table, and its index, exactly as
# sqlite-utils created them for earlier versions of notifier (its Migrations class applied
# these migrations until the runner in migrations.py replaced it). A database written by
# this version therefore reads the same to an earlier one.
MIGRATIONS_TABLE = "_sqlite_migrations"
MIGRATIONS_TABLE_DDL = """
CREATE TABLE "_sqlite_migrations" (
   "id" INTEGER PRIMARY KEY,
   "migration_set" TEXT,
   "name" TEXT,
   "applied_at" TEXT
);

CREATE UNIQUE INDEX "idx__sqlite_migrations_migration_set_name"
    ON "_sqlite_migrations" ("migration_set", "name");
"""

M001 = f"""
PRAGMA application_id = {APPLICATION_ID};

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
)
"""

M003 = """
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

# Triggers keep run_counts in the same transaction as every state move (migrations.py says
# why); WITHOUT ROWID because the primary key is the only way the table is read.
M004 = """
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
    WHERE kind IN ('not_found', 'mark_not_sent');
"""

M005 = """
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

# m008_suppression: addresses never to be sent to, keyed by their normalised form
# (suppression.address_key), and the audit of every add and remove (who, when, from where).
M008 = """
CREATE TABLE suppressions (
    address TEXT PRIMARY KEY,
    reason TEXT,
    source TEXT NOT NULL,
    operator TEXT NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE suppression_audit (
    id INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    operator TEXT NOT NULL,
    action TEXT NOT NULL,
    address TEXT NOT NULL,
    source TEXT NOT NULL,
    reason TEXT,
    run_id TEXT
)
"""

# Send windows: the earliest instant an item may be sent (UTC ISO, as not_after),
# and the window and time zone it was planned with, kept so that a claim finding the window
# closed again (a range ended, a paused run resumed late) can compute the next opening.
M009 = """
ALTER TABLE items ADD COLUMN not_before TEXT;

ALTER TABLE items ADD COLUMN send_window TEXT;

ALTER TABLE items ADD COLUMN send_tz TEXT;

CREATE INDEX items_not_before ON items(run_id, channel, not_before)
    WHERE state = 'pending' AND not_before IS NOT NULL
"""
