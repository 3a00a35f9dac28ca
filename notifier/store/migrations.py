"""The database schema as numbered migrations, each with its SQLite and its PostgreSQL form,
and the one runner that applies them and records which were applied.

A shipped migration is never edited: a change is a new `Migration("mNNN_…", …)` appended to
MIGRATIONS, with both forms. A form is either DDL text (schema_sqlite.py, schema_postgres.py;
statements one blank line apart) or a Python function given the engine (engine.Engine), for a
back-fill that SQL alone does not express.

Every open reads the record of applied migrations with plain SQL, and refuses a database that
has one this version does not know (checks.py). The records keep the names and tables of
earlier versions, which applied the SQLite migrations with sqlite-utils: a database written by
any earlier version opens and resumes, and one written by this version reads the same to them.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from notifier.domain import clock
from notifier.domain.intent import (
    digest_of_normalised,
    normalise_target,
    payload_json,
    row_identity,
)
from notifier.store import schema_postgres, schema_sqlite

if TYPE_CHECKING:
    from notifier.store.backend import Engine

# The migration set every record names (earlier versions' sqlite-utils Migrations("notifier")).
MIGRATION_SET = "notifier"
APPLICATION_ID = schema_sqlite.APPLICATION_ID

# A migration's form on one engine: DDL text, or a function of the engine (engine.Engine),
# whose statements take their parameters as statements/ writes them.
Form = str | Callable[["Engine"], None]


@dataclass(frozen=True)
class Migration:
    """One step of the schema, by name, in each engine's own form."""

    name: str
    sqlite: Form
    postgres: Form


def stored_content_fingerprint(engine: Engine, run_id: str) -> str:
    """The content fingerprint of a run, from its stored items (for m002's back-fill on
    either engine, and for a read-only look at a database m002 has not been applied to yet).

    The formula is written out here rather than imported, because a shipped migration must not
    change when intent.py does; it equals intent.content_fingerprint (a test pins that)."""
    h = hashlib.sha256()
    channels: set[str] = set()
    for digest, channel in engine.execute(
        "SELECT intent_digest, channel FROM items WHERE run_id = %(run_id)s ORDER BY seq",
        {"run_id": run_id},
    ):
        h.update(digest.encode("ascii"))
        h.update(b"\n")
        channels.add(channel)
    names = json.dumps(sorted(channels), separators=(",", ":"), ensure_ascii=False)
    h.update(unicodedata.normalize("NFC", names).encode("utf-8"))
    return "sha256:" + h.hexdigest()


def _m002(engine: Engine) -> None:
    """A per-run key nonce, and the content fingerprint that decides
    "already planned" (ordered intent digests + channel names, no transport tuning).

    Old runs keep their keys (keys are stored, never recomputed), so their nonce stays NULL.
    Their content fingerprint is back-filled from their stored items so that an old run
    still blocks a re-send of the same batch. The same statements on both engines, as
    shipped, sent through the engine with parameters by name."""
    engine.execute("ALTER TABLE runs ADD COLUMN key_nonce TEXT")
    engine.execute("ALTER TABLE runs ADD COLUMN content_fingerprint TEXT")
    for (run_id,) in engine.execute("SELECT run_id FROM runs").fetchall():
        engine.execute(
            "UPDATE runs SET content_fingerprint = %(fingerprint)s WHERE run_id = %(run_id)s",
            {"fingerprint": stored_content_fingerprint(engine, run_id), "run_id": run_id},
        )
    engine.execute("CREATE INDEX runs_content_fingerprint ON runs(content_fingerprint)")


# A row's identity across runs, so that `send` plans only what earlier runs in this
# database did not deliver. `items.identity` beside `items.channel` is the row's own id
# ("id:" + id) when its file had an id column, else its intent digest (channel, normalised
# recipient and content): intent.row_identity, written out here as SQL, the same on both
# engines.
#
# Old items are back-filled so that what was delivered before this migration counts. A file
# without an id column gave each row its position as item_id, so a run whose every item_id
# is its seq is taken as such a file. A file whose ids really were 1, 2, 3, … in order is
# read the same way: its rows are then matched by content, and a later copy of it with
# changed content is sent as new rows rather than refused as changed.
_M006 = """
ALTER TABLE items ADD COLUMN identity TEXT;

UPDATE items SET identity = CASE WHEN run_id IN (
        SELECT run_id FROM items GROUP BY run_id
        HAVING SUM(CASE WHEN item_id = CAST(seq AS TEXT) THEN 0 ELSE 1 END) = 0
    ) THEN intent_digest ELSE 'id:' || item_id END;

CREATE INDEX items_identity ON items(channel, identity)
"""

_M007 = """
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


# Why a run stopped, as a cause beside the prose of `stop_reason` (records.StopCause). Runs
# stopped before it get their cause from their reason, read here once, as the code before it
# read it back: the wording it wrote is fixed now that nothing writes it without a cause.
_M011 = """
ALTER TABLE runs ADD COLUMN stop_cause TEXT;

UPDATE runs SET stop_cause = CASE
        WHEN state = 'paused' AND paused_until IS NOT NULL THEN 'rate_limited'
        WHEN state = 'paused' AND stop_reason LIKE 'its approval%' THEN 'approval_expired'
        WHEN state = 'paused' AND stop_reason LIKE '% is down: %' THEN 'channel_down'
        WHEN state = 'paused' AND stop_reason LIKE 'interrupted%' THEN 'interrupted'
        WHEN state = 'paused' AND stop_reason LIKE '% item(s) with unknown outcome'
            THEN 'unknown_left'
        WHEN state = 'halted' AND stop_reason LIKE 'conflict on item %' THEN 'conflict'
        WHEN state = 'halted' THEN 'halted'
        WHEN state = 'cancelled' AND stop_reason LIKE 'rejected by %' THEN 'rejected'
        WHEN state = 'cancelled' THEN 'cancelled'
    END
    WHERE state IN ('paused', 'halted', 'cancelled')
"""


# A composed row's `tz` and `not_before` columns schedule it, as a plain row's do, and so
# are no part of its data or its identity. Rows composed before kept them in their data:
# their stored identity (a row without an `id`: its content digest) is moved to the one
# the same row has now, wherever it still is the one computed with them, so a delivered row
# is not composed and sent again; a draft not yet frozen loses them from its data, as a row
# read now would. The identity is plan.source_identity's, from intent.py's parts: should
# they change later, the old identity computed here no longer matches what is stored, and
# nothing moves.
_SCHEDULE_COLUMNS = ("not_before", "tz")


def _source_identity(row: dict[str, Any]) -> str:
    return row_identity(row["item_id"] if row.get("own_id") else None, _source_digest(row))


def _source_digest(row: dict[str, Any]) -> str:
    """plan.source_digest of a draft's stored source row (compose.row_to_source's form)."""
    payload = payload_json(
        row["subject"], row["body"], row["data"], row.get("not_after"),
        row.get("unsubscribe_url"), row.get("unsubscribe_mailto"),
    )  # fmt: skip
    return digest_of_normalised(row["channel"], normalise_target(row["to"]), payload)


def _m012(engine: Engine) -> None:
    drafts = engine.execute("SELECT run_id, seq, source FROM drafts").fetchall()
    for run_id, seq, source in drafts:
        before = json.loads(source)
        if not any(name in before["data"] for name in _SCHEDULE_COLUMNS):
            continue
        after = _as_now(before)
        where = {"run_id": run_id, "seq": seq}
        engine.execute(
            "UPDATE items SET identity = %(new)s "
            "WHERE run_id = %(run_id)s AND seq = %(seq)s AND identity = %(old)s",
            {**where, "new": _source_identity(after), "old": _source_identity(before)},
        )
        frozen = engine.execute(
            "SELECT 1 FROM items WHERE run_id = %(run_id)s AND seq = %(seq)s", where
        ).fetchall()
        if not frozen:  # compose.row_to_source's form
            engine.execute(
                "UPDATE drafts SET source = %(source)s WHERE run_id = %(run_id)s AND seq = %(seq)s",
                {**where, "source": json.dumps(after, sort_keys=True, ensure_ascii=False)},
            )


# The chain of each run's events (notifier/domain/chain.py): every event written from here on
# carries the hash of the one before it and its own; a run records how its events are
# chained and the id of its key (never the key). Runs planned before keep NULL in both: they
# verify as unsigned, and their later events stay unchained, so a run is one kind or the other.
_M013 = """
ALTER TABLE events ADD COLUMN prev_hash TEXT;

ALTER TABLE events ADD COLUMN hash TEXT;

ALTER TABLE runs ADD COLUMN audit_chain TEXT;

ALTER TABLE runs ADD COLUMN audit_key_id TEXT
"""


# `verify` replays a run's items a slice at a time (domain/verify.py) and reads each slice's
# events by item number, each item's in order: without this index every slice read every
# event of the run, so a run of a million items took its events' count times two hundred
# reads.
_M014 = """
CREATE INDEX events_by_item ON events(run_id, item_seq, seq_no)
"""

_M015 = """
ALTER TABLE workers ADD COLUMN pid_space TEXT
"""

# A row of a file without an `id` column is identified by its content (intent.row_identity):
# planning finds the earlier items with ids that had the same channel and content through
# this index (statements/history.py), so a file re-sent with its `id` column dropped is
# compared with the rows it delivered, not taken for new rows. Only items with ids: an
# id-less item's identity is its digest, which items_identity already finds.
_M016 = """
CREATE INDEX items_content ON items(channel, intent_digest) WHERE identity <> intent_digest
"""


# A composed row's item has its drafted text's digest; the content of the row it was drafted
# from is kept with its draft, so a file composed with an `id` column and sent again without
# it finds the rows it delivered (statements/history.py). Drafts stored before are back-filled
# from their stored source rows as they read now, with the formula plan.source_digest uses.
def _m018(engine: Engine) -> None:
    engine.execute("ALTER TABLE drafts ADD COLUMN source_digest TEXT")
    engine.execute(
        "CREATE INDEX drafts_by_content ON drafts(source_digest) WHERE source_digest IS NOT NULL"
    )
    for run_id, seq, source in engine.execute("SELECT run_id, seq, source FROM drafts").fetchall():
        engine.execute(
            "UPDATE drafts SET source_digest = %(digest)s WHERE run_id = %(run_id)s "
            "AND seq = %(seq)s",
            {"run_id": run_id, "seq": seq, "digest": _source_digest(_as_now(json.loads(source)))},
        )


# A row's `id` is compared in NFC (intent.row_identity): items stored before kept it as the
# file wrote it, so a file saved again with its ids in the other form would be new rows, all
# sent again (the formula written out, as a shipped migration's must be). Only identities
# with a character beyond ASCII can change (ASCII is its own NFC), and the engine picks
# those out, so an upgrade reads few rows of a large ledger.
# items.item_id keeps the id as written: it is what the operator reads, and what the run's
# event chain signed.
def _m019_over(beyond_ascii: str) -> Callable[[Engine], None]:
    def migrate(engine: Engine) -> None:
        rows = engine.execute(
            "SELECT run_id, seq, identity FROM items "
            f"WHERE identity LIKE 'id:%%' AND {beyond_ascii}"
        ).fetchall()
        for run_id, seq, identity in rows:
            if (now := "id:" + unicodedata.normalize("NFC", identity[3:])) != identity:
                engine.execute(
                    "UPDATE items SET identity = %(now)s "
                    "WHERE run_id = %(run_id)s AND seq = %(seq)s",
                    {"now": now, "run_id": run_id, "seq": seq},
                )

    return migrate


# A composed row without an `id` has the identity of its source row (plan.source_identity:
# its content as the file gives it), not its drafted text's digest. Composed rows stored
# before that (every composed run back-filled by m006, and those planned until the change)
# kept their intent digest, the drafted text's: the same file composed again, whose draft a
# model words otherwise, or sent as written, would be new rows, all sent again. Each such
# item takes its draft's source_digest (m018's, the row's content as it reads now), which is
# exactly the identity the same row of the same file has now; the items composed since
# already have it, and are left alone. Read from the drafts, which are few beside the items.
def _m020(engine: Engine) -> None:
    rows = engine.execute(
        "SELECT i.run_id, i.seq, d.source_digest FROM drafts d "
        "JOIN items i ON i.run_id = d.run_id AND i.seq = d.seq "
        "WHERE d.source_digest IS NOT NULL AND i.identity NOT LIKE 'id:%%' "
        "AND i.identity <> d.source_digest"
    ).fetchall()
    for run_id, seq, source_digest in rows:
        engine.execute(
            "UPDATE items SET identity = %(now)s WHERE run_id = %(run_id)s AND seq = %(seq)s",
            {"now": source_digest, "run_id": run_id, "seq": seq},
        )


# A row without an `id` is identified by its row digest (intent.row_digest): its intent
# digest without its deadline and with its line breaks written `\n`. Rows stored before kept
# their intent digest, so the same file sent again with a later `--not-after`, none, or saved
# with `\r\n` the other way would be new rows, all sent again. Plain items (no draft) whose
# identity is their intent digest move to their row digest; drafts' source digests (m018's)
# and the composed items without an id that carry them move to the source row's. Only a
# payload holding a deadline or a `\r` (escaped in its JSON) can change, and the engine picks
# those out; drafts are few beside the items. The formula written out, as a shipped
# migration's must be. items_content (m016) now also holds the plain items so moved.
def _m021_over(deadline_or_cr: str) -> Callable[[Engine], None]:
    def migrate(engine: Engine) -> None:
        plain = f"identity = intent_digest AND {deadline_or_cr}"
        for run_id, seq, channel, target, payload, identity in _plain_items(engine, plain):
            fields = json.loads(payload)
            fields.update(channel=channel, to=target)
            if (now := _m021_digest(fields)) != identity:
                _move_identity(engine, run_id, seq, identity, now)
        drafts = engine.execute(
            "SELECT run_id, seq, source, source_digest FROM drafts WHERE source_digest IS NOT NULL"
        ).fetchall()
        for run_id, seq, source, before in drafts:
            if (now := _m021_digest(_as_now(json.loads(source)))) == before:
                continue
            engine.execute(
                "UPDATE drafts SET source_digest = %(now)s "
                "WHERE run_id = %(run_id)s AND seq = %(seq)s",
                {"now": now, "run_id": run_id, "seq": seq},
            )
            _move_identity(engine, run_id, seq, before, now)

    return migrate


_M021_CHUNK = 5000


def _plain_items(engine: Engine, where: str) -> Iterator[tuple[Any, ...]]:
    """(run_id, seq, channel, target, payload, intent_digest) of every item not composed
    (no draft) matching `where`, a chunk at a time in key order: a million items with a
    deadline are a million payloads, which must not all be held at once. Each chunk is read
    whole before its rows are given out, so a row's update cannot move the next chunk's
    start."""
    after: dict[str, Any] = {"run_id": "", "seq": -1}
    while rows := engine.execute(
        "SELECT run_id, seq, channel, target, payload, intent_digest FROM items "
        "WHERE (run_id > %(run_id)s OR (run_id = %(run_id)s AND seq > %(seq)s)) "
        f"AND {where} AND NOT EXISTS "
        "(SELECT 1 FROM drafts d WHERE d.run_id = items.run_id AND d.seq = items.seq) "
        f"ORDER BY run_id, seq LIMIT {_M021_CHUNK}",
        after,
    ).fetchall():
        yield from rows
        after = {"run_id": rows[-1][0], "seq": rows[-1][1]}


# A row with an `id` keeps its row digest where that is not its intent digest (it has a
# deadline or a `\r`): an id-less row of its content has that identity whatever its
# deadline or line breaks, so the same file sent again without its id column and with
# another deadline (or none) is compared with what it delivered (statements/history.py),
# never sent again as new rows. Plain items with ids stored before are given theirs, read
# only where the payload holds a deadline or a `\r`, a chunk at a time; a composed item is
# compared through its draft's source digest (m018, m021) and keeps none.
def _m022_over(deadline_or_cr: str) -> Callable[[Engine], None]:
    def migrate(engine: Engine) -> None:
        engine.execute("ALTER TABLE items ADD COLUMN row_digest TEXT")
        engine.execute(
            "CREATE INDEX items_row_digest ON items(channel, row_digest) "
            "WHERE row_digest IS NOT NULL"
        )
        with_ids = f"identity LIKE 'id:%%' AND {deadline_or_cr}"
        for run_id, seq, channel, target, payload, digest in _plain_items(engine, with_ids):
            fields = json.loads(payload)
            fields.update(channel=channel, to=target)
            if (row_digest := _m021_digest(fields)) != digest:
                engine.execute(
                    "UPDATE items SET row_digest = %(row_digest)s "
                    "WHERE run_id = %(run_id)s AND seq = %(seq)s",
                    {"row_digest": row_digest, "run_id": run_id, "seq": seq},
                )

    return migrate


def _m021_digest(row: dict[str, Any]) -> str:
    """intent.row_digest of a stored row (its channel, `to`, subject, body, data and
    unsubscribe addresses)."""

    def one(text: str) -> str:
        return text.replace("\r\n", "\n").replace("\r", "\n")

    payload = payload_json(
        one(row["subject"]), one(row["body"]), {k: one(v) for k, v in row["data"].items()},
        None, row.get("unsubscribe_url"), row.get("unsubscribe_mailto"),
    )  # fmt: skip
    return digest_of_normalised(row["channel"], normalise_target(row["to"]), payload)


def _move_identity(engine: Engine, run_id: str, seq: int, before: str, now: str) -> None:
    engine.execute(
        "UPDATE items SET identity = %(now)s "
        "WHERE run_id = %(run_id)s AND seq = %(seq)s AND identity = %(before)s",
        {"now": now, "run_id": run_id, "seq": seq, "before": before},
    )


def _as_now(row: dict[str, Any]) -> dict[str, Any]:
    """A stored source row as it reads now: a draft frozen before m012 kept its `tz` and
    `not_before` columns in its data (m012 moved its item's identity, not its source)."""
    data = {k: v for k, v in row["data"].items() if k not in _SCHEDULE_COLUMNS}
    return {**row, "data": data}


def _unchanged_on_sqlite(engine: Engine) -> None:
    """Nothing to change for SQLite's counters: one writer at a time, so counters updated at
    each move are never waited for by another transaction (m010), and a counter row is
    written in place, however often one transaction writes it (m017)."""


# Every migration, in the order they apply.
MIGRATIONS: tuple[Migration, ...] = (
    Migration("m001_initial", schema_sqlite.M001, schema_postgres.M001),
    Migration("m002_key_nonce_content_fingerprint", _m002, _m002),
    # Item deadlines (`not_after`, also inside the digested payload; the column only lets a
    # claim find due deadlines through an index) and Claude drafts, stored per row before the
    # intents are computed, so a resumed run never asks for a draft twice.
    Migration("m003_deadlines_and_drafts", schema_sqlite.M003, schema_postgres.M003),
    # The cost of `status`, `resume`, `cancel` and `runs` depends on the
    # items that need attention, never on the size of the run. `run_counts` holds, per run
    # and state, how many items are in it. Triggers on `items` keep it in the same transaction
    # as every state move, whichever code path makes the move, so the counts cannot drift
    # from the rows; existing runs are back-filled. Inserts are counted by the one function
    # that inserts items (Planning.insert_items), once per plan: a trigger firing a million
    # times would add a third to planning a million rows. The partial indexes let every
    # start-up and report query read only the rows it is about.
    Migration("m004_counts_and_attention_indexes", schema_sqlite.M004, schema_postgres.M004),
    # Many workers on one run (PostgreSQL). Each worker holds a lease row of its
    # own (`workers`); a claimed item records which worker holds it (`items.worker_id`), so a
    # live worker can settle exactly the items of a dead one. `rate_buckets` is a channel's
    # --rate bucket shared by all the workers of a run, and `channel_gates` the time until
    # which a throttled answer to any of them closed a channel. On SQLite one process works a
    # run, under the run's own lease; the tables exist so that both engines keep one schema.
    Migration("m005_workers", schema_sqlite.M005, schema_postgres.M005),
    Migration("m006_item_identity", _M006, _M006),
    # A --compose run drafting through Message Batches keeps one row per chunk, an
    # intent like any send's: recorded `creating` (its rows, the digest of its requests, a
    # time lower bound) before the batch is created, `submitted` with the batch id after, then
    # `done` once its results are stored, or `canceled`. A chunk still `creating` on resume is
    # settled by asking the API (batches since `not_before` with `request_count` requests
    # whose results carry the chunk's custom_ids), or created again when `recreate` is set.
    Migration("m007_draft_chunks", _M007, _M007),
    # The suppression list (`suppressions`, one row per normalised address, with
    # its reason and source: operator, import or relay) and its audit trail
    # (`suppression_audit`: every add and remove with the operator and the time). Items of a
    # suppressed recipient are `suppressed`, a new state needing no schema change: states are
    # text, and m004's counters count whatever state an item moves to.
    Migration("m008_suppression", schema_sqlite.M008, schema_postgres.M008),
    # Send windows and a start time (schema_sqlite.M009 says what each column is).
    # Not part of the intent: when an item goes out is not what goes out.
    Migration("m009_send_windows", schema_sqlite.M009, schema_postgres.M009),
    # PostgreSQL workers write one run concurrently, with no lock of the schema;
    # the run counters' triggers fire at COMMIT (schema_postgres.M010). SQLite has one
    # writer at a time, so its triggers stay as they are.
    Migration("m010_counts_at_commit", _unchanged_on_sqlite, schema_postgres.M010),
    Migration("m011_stop_cause", _M011, _M011),
    Migration("m012_composed_identity_without_schedule", _m012, _m012),
    Migration("m013_event_chain", _M013, _M013),
    Migration("m014_events_by_item", _M014, _M014),
    # Which machine boot and PID namespace a worker's pid belongs to (membership.PID_SPACE):
    # a worker with the same host name in another namespace (a container on the host's
    # network) is judged by its lease's expiry, never by a pid that names another process.
    Migration("m015_worker_pid_space", _M015, _M015),
    Migration("m016_items_by_content", _M016, _M016),
    # PostgreSQL's run counters move once per transaction, from each statement's net moves
    # (schema_postgres.M017): a bulk move is linear in its items. SQLite writes a counter row
    # in place, so its per-row triggers stay.
    Migration("m017_counts_once_per_transaction", _unchanged_on_sqlite, schema_postgres.M017),
    Migration("m018_drafts_by_content", _m018, _m018),
    Migration(
        "m019_row_identity_in_nfc",
        _m019_over("identity GLOB '*[^ -~]*'"),
        _m019_over("identity ~ '[^ -~]'"),
    ),
    Migration("m020_composed_rows_by_their_source", _m020, _m020),
    Migration(
        "m021_rows_without_ids_by_their_row_digest",
        _m021_over("(instr(payload, '\"not_after\":') > 0 OR instr(payload, '\\r') > 0)"),
        _m021_over("(strpos(payload, '\"not_after\":') > 0 OR strpos(payload, '\\r') > 0)"),
    ),
    Migration(
        "m022_rows_with_ids_by_their_row_digest_too",
        _m022_over("(instr(payload, '\"not_after\":') > 0 OR instr(payload, '\\r') > 0)"),
        _m022_over("(strpos(payload, '\"not_after\":') > 0 OR strpos(payload, '\\r') > 0)"),
    ),
)
NAMES = frozenset(m.name for m in MIGRATIONS)


def statements(script: str) -> list[str]:
    """The statements of a DDL text, in order, without their `;`. Each runs to its `;`, or,
    the last one written without `;`, to the end of the text: as SQLite reads a statement, and
    keeps its text in sqlite_master. So the texts stored there are those the code before this
    runner stored, to the byte (a trailing line break included), as a test pins."""
    found = []
    for chunk in script.split(";\n\n"):
        text = chunk.lstrip()
        if text.rstrip().endswith(";"):
            text = text.rstrip()[:-1]
        if text.strip():
            found.append(text)
    return found


@dataclass(frozen=True)
class Migrator:
    """The runner, for one engine: which form of each migration it applies, how it runs one
    statement, and where it records what was applied. SQLITE and POSTGRES below are the two."""

    form: Callable[[Migration], Form]
    suffix: str  # after each statement of a DDL text, as the engine reads one whole
    table: str  # the record of applied migrations
    table_ddl: str
    stamp: Callable[[], str]  # applied_at

    def applied(self, engine: Engine) -> set[str]:
        """The names of the migrations applied to `engine`'s database (none if it never had
        one)."""
        if not engine.has_table(self.table):
            return set()
        return {
            name
            for (name,) in engine.execute(
                f"SELECT name FROM {self.table} WHERE migration_set = %(set)s",
                {"set": MIGRATION_SET},
            ).fetchall()
        }

    def apply(self, engine: Engine, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
        """Apply the migrations `engine`'s database lacks, in order, each recorded with it,
        inside the caller's write transaction (under its write lock, so two processes opening
        an older database at once cannot both apply one; DDL is transactional on both
        engines, so a crash leaves all of them or none). Returns the names applied.

        `migrations` is a prefix of MIGRATIONS only where a test builds a database as an
        earlier version left it."""
        done = self.applied(engine)
        pending = [m for m in migrations if m.name not in done]
        if pending and not engine.has_table(self.table):
            for statement in statements(self.table_ddl):
                engine.execute_ddl(statement + self.suffix)
        for migration in pending:
            form = self.form(migration)
            if isinstance(form, str):
                for statement in statements(form):
                    engine.execute_ddl(statement + self.suffix)
            else:
                form(engine)
            engine.execute(
                f"INSERT INTO {self.table} (migration_set, name, applied_at) "
                "VALUES (%(set)s, %(name)s, %(at)s)",
                {"set": MIGRATION_SET, "name": migration.name, "at": self.stamp()},
            )
        return [m.name for m in pending]


SQLITE = Migrator(
    form=lambda m: m.sqlite,
    # SQLite reads a CREATE TRIGGER as complete only with the `;` after its END.
    suffix=";",
    table=schema_sqlite.MIGRATIONS_TABLE,
    table_ddl=schema_sqlite.MIGRATIONS_TABLE_DDL,
    # The text sqlite-utils wrote for earlier versions, so one file keeps one format.
    stamp=lambda: str(datetime.now(UTC)),
)
POSTGRES = Migrator(
    form=lambda m: m.postgres,
    suffix="",
    table=schema_postgres.MIGRATIONS_TABLE,
    table_ddl=schema_postgres.MIGRATIONS_TABLE_DDL,
    stamp=clock.now_iso,
)
