"""Every statement the store's parts send, by name, written once for both engines.

Notation. Parameters are written as psycopg writes them, `%(name)s` (a literal `%` is
`%%`); the dialect's fragments (engine.Dialect, and the engine's index hints) as
`{row_lock}`, `{claim_lock}`, `{share_lock}`, `{ordered_join}`, `{now_s}`, `{least}`,
`{indexed_items_attention}`…: `fragments` lists them all. Each engine compiles a statement
the first time it sends it, into its driver's own form: SQLite's `:name`, PostgreSQL's `$n`
(psycopg's RawCursor). Python's own str.format and %-formatting do that: nothing parses SQL.

A statement whose shape varies (n values in a list, the columns a move sets) is a function
here returning the statement for that shape. The engines' own statements (pragmas, COPY,
numbering events) stay in sqlite.py and postgres.py: they exist on one engine only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records import MAYBE_DELIVERED_OUTCOMES
from ..state_machine import ACTIVE_ITEM_STATES, ItemState

if TYPE_CHECKING:
    from .engine import Dialect

# The partial indexes an SQLite read may name with INDEXED BY (engine.indexed): a fragment
# `{indexed_NAME}` each.
HINTED_INDEXES = ("items_attention", "items_retried", "items_pending_channel")


def fragments(dialect: Dialect, indexed: dict[str, str]) -> dict[str, str]:
    """The `{name}` fragments of an engine: its dialect's SQL pieces and index hints."""
    return {
        "ordered_join": dialect.ordered_join,
        "claim_lock": dialect.claim_lock,
        "row_lock": dialect.row_lock,
        "share_lock": dialect.share_lock,
        "now_s": dialect.now_s,
        "least": dialect.least,
        **{f"indexed_{index}": hint for index, hint in indexed.items()},
    }


class _Named(dict[str, str]):
    """`%(name)s` as SQLite's `:name`."""

    def __missing__(self, name: str) -> str:
        return f":{name}"


class _Numbered(dict[str, str]):
    """`%(name)s` as PostgreSQL's `$n`, numbered in order of first appearance (a name used
    twice is one parameter); the dict's order is then the parameters' order."""

    def __missing__(self, name: str) -> str:
        self[name] = f"${len(self) + 1}"
        return self[name]


def for_sqlite(statement: str, fragments: dict[str, str]) -> str:
    """The statement in sqlite3's named style, bound from a mapping as given."""
    return statement.format_map(fragments) % _Named()


def for_postgres(statement: str, fragments: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The statement with `$n` parameters, and the names to bind in `$n` order."""
    numbered = _Numbered()
    text = statement.format_map(fragments) % numbered
    return text, tuple(numbered)


# ---------------------------------------------------------------- conditions many share

ACTIVE = "state IN ({})".format(", ".join(f"'{s.value}'" for s in ACTIVE_ITEM_STATES))
# The states someone has to look at; repeating m004's partial index condition word for word
# lets SQLite use items_attention (it matches a partial index only on the very same terms).
ATTENTION_STATES = (ItemState.IN_FLIGHT, ItemState.UNKNOWN, ItemState.FAILED)
ATTENTION = "state IN ({})".format(", ".join(f"'{s.value}'" for s in ATTENTION_STATES))
# Whether an item `i` may have reached its recipient: one of its attempts had an outcome
# that proves nothing (records.MAYBE_DELIVERED_OUTCOMES), and no later query (`not_found`) or
# operator (`mark_not_sent`) proved otherwise. Any such attempt counts, not only the last: a
# 429 or a release after a 500 says nothing about the 500's request. Such an item is never
# called never sent (expired).
MAYBE_DELIVERED = (
    "EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = i.run_id AND a.seq = i.seq AND "
    "a.outcome IN ({}) AND NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = i.run_id "
    "AND e.item_seq = i.seq AND e.kind IN ('not_found', 'mark_not_sent') "
    "AND e.at >= a.finished_at))"
).format(", ".join(f"'{outcome}'" for outcome in MAYBE_DELIVERED_OUTCOMES))


def state_literal(state: ItemState) -> str:
    """An item state as an SQL literal, for the condition of a conditional move. Bound as a
    parameter, it made SQLite prepare the statement again on every execution (it weighs a
    bound value against the partial indexes' `state` conditions, so binding it again expires
    the plan): measured, a third of the committer's SQL work was parsing."""
    return f"'{ItemState(state).value}'"


# ---------------------------------------------------------------- core.py

# ---------------------------------------------------------------- ledger.py

# ---------------------------------------------------------------- planning.py

# ---------------------------------------------------------------- history.py

# ---------------------------------------------------------------- suppressions.py

# ---------------------------------------------------------------- chunks.py

_CHUNK_COLUMNS = (
    "run_id, chunk, state, seqs, request_count, requests_digest, model, not_before, "
    "batch_id, recreate, created, note"
)
CHUNKS = f"SELECT {_CHUNK_COLUMNS} FROM draft_chunks WHERE run_id = %(run_id)s ORDER BY chunk"
RECORD_CHUNK = (
    "INSERT INTO draft_chunks (run_id, chunk, state, seqs, request_count, "
    "requests_digest, model, not_before, updated_at) "
    "VALUES (%(run_id)s, %(chunk)s, 'creating', %(seqs)s, %(request_count)s, "
    "%(requests_digest)s, %(model)s, %(not_before)s, %(at)s)"
)
CHUNK_CREATE_STARTED = (
    "UPDATE draft_chunks SET recreate = 0, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND chunk = %(chunk)s AND state = 'creating'"
)
CHUNK_SUBMITTED = (
    "UPDATE draft_chunks SET state = 'submitted', batch_id = %(batch_id)s, recreate = 0, "
    "created = created + %(created)s, note = %(note)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND chunk = %(chunk)s AND state = 'creating'"
)
END_CHUNK = (
    "UPDATE draft_chunks SET state = %(state)s, note = COALESCE(%(note)s, note), "
    "updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND chunk = %(chunk)s AND state IN ('creating', 'submitted')"
)
CHOOSE_RECREATE = (
    "UPDATE draft_chunks SET recreate = 1, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND state = 'creating'"
)
CHUNK_SUMMARY = (
    "SELECT state, COUNT(*), COALESCE(SUM(created), 0) FROM draft_chunks "
    "WHERE run_id = %(run_id)s GROUP BY state"
)

# ---------------------------------------------------------------- drafts.py

INSERT_DRAFT = (
    "INSERT INTO drafts (run_id, seq, line, source, state) "
    "VALUES (%(run_id)s, %(seq)s, %(line)s, %(source)s, 'pending')"
)
PENDING_DRAFTS = (
    "SELECT seq, source FROM drafts WHERE run_id = %(run_id)s AND state = 'pending' ORDER BY seq"
)
SAVE_DRAFT = (
    "UPDATE drafts SET state = 'drafted', subject = %(subject)s, body = %(body)s, "
    "model = %(model)s, input_tokens = %(input_tokens)s, output_tokens = %(output_tokens)s, "
    "error = NULL, drafted_at = %(at)s "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = 'pending'"
)
# What an unusable answer cost, counted with the run's tokens all the same.
DRAFT_USAGE = (
    "UPDATE drafts SET model = %(model)s, input_tokens = %(input_tokens)s, "
    "output_tokens = %(output_tokens)s "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = %(expected)s"
)
FAIL_DRAFT = (
    "UPDATE drafts SET state = 'failed', error = %(error)s, drafted_at = %(at)s "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = %(expected)s"
)
# A run still drafting (not frozen: fingerprint empty), read to be written.
DRAFTING_RUN_OPTIONS = (
    "SELECT options FROM runs WHERE run_id = %(run_id)s AND fingerprint = '' {row_lock}"
)
SET_RUN_OPTIONS = (
    "UPDATE runs SET options = %(options)s, updated_at = %(at)s WHERE run_id = %(run_id)s"
)
PENDING_DRAFT_COUNT = "SELECT COUNT(*) FROM drafts WHERE run_id = %(run_id)s AND state = 'pending'"
REDRAFT_RUN = (
    "UPDATE runs SET fingerprint = %(fingerprint)s, "
    "content_fingerprint = %(content_fingerprint)s, approval = NULL, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND state = 'awaiting_approval' AND fingerprint = %(before)s"
)
# Tokens add up: both drafts were paid.
REDRAFT = (
    "UPDATE drafts SET state = 'drafted', subject = %(subject)s, body = %(body)s, "
    "model = %(model)s, input_tokens = COALESCE(input_tokens, 0) + %(input_tokens)s, "
    "output_tokens = COALESCE(output_tokens, 0) + %(output_tokens)s, error = NULL, "
    "drafted_at = %(at)s WHERE run_id = %(run_id)s AND seq = %(seq)s"
)
# A row whose first draft failed is planned again (m004's trigger moves its count); one
# ever attempted is not touched.
REDRAFT_ITEM = (
    "UPDATE items SET payload = %(payload)s, intent_digest = %(digest)s, "
    "identity = %(identity)s, state = 'pending', last_error = NULL, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND state IN ('pending', 'failed') "
    "AND attempts = 0"
)
DRAFTS = (
    "SELECT seq, line, source, state, subject, body, model, input_tokens, "
    "output_tokens, error FROM drafts WHERE run_id = %(run_id)s ORDER BY seq"
)
DRAFT_STATES = "SELECT state, COUNT(*) FROM drafts WHERE run_id = %(run_id)s GROUP BY state"
# Named: two unnamed COALESCEs would be two columns of one name, which a named-tuple row
# (psycopg's namedtuple_row) refuses.
DRAFT_TOKENS = (
    "SELECT COALESCE(SUM(input_tokens), 0) AS input_tokens, "
    "COALESCE(SUM(output_tokens), 0) AS output_tokens FROM drafts WHERE run_id = %(run_id)s"
)
DRAFT_FAILURES = (
    "SELECT seq, line, error FROM drafts WHERE run_id = %(run_id)s AND state = 'failed' "
    "ORDER BY seq"
)
# Only once: a run already frozen is never planned again.
FREEZE_RUN = (
    "UPDATE runs SET fingerprint = %(fingerprint)s, "
    "content_fingerprint = %(content_fingerprint)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND fingerprint = '' AND state = 'planned'"
)
# m004's trigger moves the count from pending to failed.
FAIL_FROZEN_ITEM = (
    "UPDATE items SET state = 'failed', last_error = %(error)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = 'pending'"
)

# ---------------------------------------------------------------- leases.py

# m005's items_held condition, word for word: SQLite uses a partial index only then.
HELD = "state IN ('in_flight', 'unknown')"
TAKE_LEASE = (
    "UPDATE runs SET lease_owner = %(owner)s, lease_version = %(version)s, "
    "lease_expires_at = %(expires_at)s "
    "WHERE run_id = %(run_id)s AND lease_version = %(previous)s"
)
RENEW_LEASE = (
    "UPDATE runs SET lease_expires_at = %(expires_at)s "
    "WHERE run_id = %(run_id)s AND lease_version = %(lease_version)s"
)
RELEASE_LEASE = (
    "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
    "WHERE run_id = %(run_id)s AND lease_version = %(lease_version)s"
)
RENEW_WORKER = (
    "UPDATE workers SET heartbeat_at = %(at)s, expires_at = %(expires_at)s "
    "WHERE worker_id = %(worker_id)s AND version = %(version)s AND state = 'live'"
)
RELEASE_WORKER = (
    "UPDATE workers SET state = 'released' "
    "WHERE worker_id = %(worker_id)s AND version = %(version)s AND state = 'live'"
)
# Each live worker, and how many items it holds in flight.
LIVE_WORKERS = (
    "SELECT worker_id, run_id, host, pid, process_start, state, version, joined_at, "
    "heartbeat_at, expires_at, (SELECT COUNT(*) FROM items i WHERE i.run_id = w.run_id "
    f"AND i.{HELD} AND i.state = 'in_flight' AND i.worker_id = w.worker_id) "
    "FROM workers w WHERE w.run_id = %(run_id)s AND w.state = 'live' ORDER BY w.joined_at"
)


def adopt_items(n: int) -> str:
    """Items `%(s0)s`… `%(s{n-1})s` of the run now held by the worker adopting them."""
    seqs = ", ".join(f"%(s{i})s" for i in range(n))
    return (
        f"UPDATE items SET worker_id = %(worker_id)s WHERE run_id = %(run_id)s AND seq IN ({seqs})"
    )


# Items in flight or unknown that no live worker holds.
ORPHANS = (
    "SELECT seq FROM items i WHERE i.run_id = %(run_id)s AND i.state IN "
    "('in_flight', 'unknown') AND (i.worker_id IS NULL OR i.worker_id != %(worker_id)s) "
    "AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = i.worker_id "
    "AND w.state = 'live') ORDER BY seq"
)
LEAVE_RUN = (
    "UPDATE workers SET state = 'released' WHERE worker_id = %(worker_id)s AND state = 'live'"
)
HOLDS_UNKNOWN = (
    "SELECT 1 FROM items WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s "
    f"AND {HELD} AND state = 'unknown' AND next_attempt_at IS NOT NULL LIMIT 1"
)
REAP_WORKER = (
    "UPDATE workers SET state = 'reaped', version = version + 1 "
    "WHERE worker_id = %(worker_id)s AND version = %(version)s AND state = 'live'"
)

# ---------------------------------------------------------------- queries.py

# ---------------------------------------------------------------- waiting.py

# ---------------------------------------------------------------- buckets.py

# ---------------------------------------------------------------- checks.py

SENT_WITHOUT_RECEIPT = (
    "SELECT i.run_id, i.seq FROM items i WHERE i.state = 'sent' AND NOT EXISTS "
    "(SELECT 1 FROM receipts r WHERE r.idempotency_key = i.idempotency_key) LIMIT 5"
)
IN_FLIGHT_WITHOUT_ATTEMPT = (
    "SELECT i.run_id, i.seq FROM items i {indexed_items_attention} "
    f"WHERE {ATTENTION} AND i.state = 'in_flight' "
    "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = i.run_id "
    "AND a.seq = i.seq AND a.finished_at IS NULL) LIMIT 5"
)
RECEIPT_OF_ANOTHER_DIGEST = (
    "SELECT i.run_id, i.seq FROM receipts r {ordered_join} items i "
    "ON i.idempotency_key = r.idempotency_key "
    "WHERE i.state = 'sent' AND r.intent_digest != i.intent_digest LIMIT 5"
)
RUN_IDS = "SELECT run_id FROM runs"
COMPLETED_WITH_ACTIVE_ITEMS = (
    "SELECT r.run_id FROM runs r WHERE r.state = 'completed' AND EXISTS "
    f"(SELECT 1 FROM items i WHERE i.run_id = r.run_id AND {ACTIVE}) LIMIT 5"
)
# Two queries: SQLite reads MIN or MAX alone from the index's edge, both at once not.
FIRST_EVENT = "SELECT MIN(seq_no) FROM events WHERE run_id = %(run_id)s"
LAST_EVENT = "SELECT MAX(seq_no) FROM events WHERE run_id = %(run_id)s"
EVENTS_UP_TO = "SELECT COUNT(*) FROM events WHERE run_id = %(run_id)s AND seq_no <= %(seq_no)s"
EVENTS_AFTER = "SELECT COUNT(*) FROM events WHERE run_id = %(run_id)s AND seq_no > %(seq_no)s"
RECEIPT_COUNT = "SELECT COUNT(*) FROM receipts"
SENT_COUNT = "SELECT COALESCE(SUM(n), 0) FROM run_counts WHERE state = 'sent'"

# ---------------------------------------------------------------- stage.py

# ---------------------------------------------------------------- writes.py
