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

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..records import MAYBE_DELIVERED_OUTCOMES
from ..state_machine import ACTIVE_ITEM_STATES, FINISHED_RUN_STATES, ItemState
from .prior import CHANGED, DELIVERED, OPEN, RETRIED, UNSETTLED

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

# The fences (core.Core._fence_query): the version the writer's lease must still hold, its
# one parameter the lease's key. A worker's own lease is read shared, held to COMMIT: a
# reap of that worker waits for the commit, or the commit sees the reap.
WORKER_LEASE_FENCE = (
    "SELECT version FROM workers WHERE worker_id = %(key)s AND state = 'live' {share_lock}"
)
# The run's own lease is exclusive: its transactions take the run's row for good.
RUN_LEASE_FENCE = "SELECT lease_version FROM runs WHERE run_id = %(key)s {row_lock}"
RUNS = "SELECT * FROM runs ORDER BY created_at DESC, rowid DESC"
RUN = "SELECT * FROM runs WHERE run_id = %(run_id)s"
# Read to be written in this transaction: the row is held to COMMIT.
LOCKED_RUN = "SELECT * FROM runs WHERE run_id = %(run_id)s {row_lock}"
RUNS_WITH_CONTENT_FINGERPRINT = (
    "SELECT * FROM runs WHERE content_fingerprint = %(content_fingerprint)s "
    "ORDER BY created_at DESC, rowid DESC"
)

# The shapes below are cached: a move's columns are fixed by its caller, so they are few, and
# the same text each time is one dict probe for the engine's compiled statements.


@functools.cache
def move_item(current: ItemState, columns: tuple[str, ...]) -> str:
    """An item's conditional move from `current` (a literal: see state_literal) to
    `%(target)s`, setting `columns` too, each bound by its own name."""
    sets = "".join(f", {column} = %({column})s" for column in columns)
    return (
        f"UPDATE items SET state = %(target)s, updated_at = %(at)s{sets} "
        f"WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = {state_literal(current)}"
    )


@functools.cache
def move_run(columns: tuple[str, ...]) -> str:
    """A run's conditional move from `%(current)s` to `%(target)s`, setting `columns` too."""
    sets = "".join(f", {column} = %({column})s" for column in columns)
    return (
        f"UPDATE runs SET state = %(target)s, updated_at = %(at)s{sets} "
        "WHERE run_id = %(run_id)s AND state = %(current)s"
    )


@functools.cache
def insert_row(table: str, columns: tuple[str, ...]) -> str:
    """One row of `table`, each of `columns` bound by its own name."""
    values = ", ".join(f"%({column})s" for column in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values})"


# ---------------------------------------------------------------- ledger.py

REPLACE_STOP_REASON = (
    "UPDATE runs SET stop_reason = %(reason)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND stop_reason = %(expected)s"
)
_DUE_FOR_EXPIRY = (
    "SELECT i.seq FROM items i WHERE i.run_id = %(run_id)s AND i.state = 'pending' "
    "AND i.not_after IS NOT NULL AND i.not_after <= %(at)s AND (i.attempts = 0 OR "
    f"NOT {MAYBE_DELIVERED}) ORDER BY i.seq"
)
DUE_FOR_EXPIRY = _DUE_FOR_EXPIRY
# Locked as claims lock theirs: an item another worker is claiming is left to its claim.
DUE_FOR_EXPIRY_LOCKED = _DUE_FOR_EXPIRY + " {claim_lock}"
PAST_DEADLINE = (
    "SELECT COUNT(*) FROM items WHERE run_id = %(run_id)s AND state = 'pending' "
    "AND not_after IS NOT NULL AND not_after <= %(at)s"
)
# One answered send's row of the VALUES the acks' statements read (column1 … column10).
_ACK_FIELDS = ("seq", "finished", "outcome", "status", "error", "retry", "receipt", "source",
               "evidence", "started")  # fmt: skip


@functools.cache
def ack_names(n: int) -> tuple[tuple[str, ...], ...]:
    """The parameters of `ack_values(n)`, row by row, in column order."""
    return tuple(tuple(f"{field}{i}" for field in _ACK_FIELDS) for i in range(n))


@functools.cache
def ack_values(n: int) -> str:
    """The VALUES rows of n answered sends. The first row's CASTs type the columns:
    PostgreSQL cannot infer the type of a column that is all NULL parameters (http_status and
    retry_after_s often are)."""
    rows = []
    for i, names in enumerate(ack_names(n)):
        marks = [f"%({name})s" for name in names]
        if i == 0:
            marks[3] = f"CAST({marks[3]} AS INTEGER)"
            marks[5] = f"CAST({marks[5]} AS DOUBLE PRECISION)"
        rows.append(f"({', '.join(marks)})")
    return ", ".join(rows)


# A group commit's acks (Ledger._record_acks), each reading the answers from `{v}`: the
# VALUES rows, or the WITH naming them (see writes.py).
CLOSE_ACKED_ATTEMPTS = (
    "UPDATE attempts SET finished_at = v.column2, outcome = v.column3, "
    "http_status = v.column4, error = v.column5, retry_after_s = v.column6, "
    "started_at = COALESCE(v.column10, attempts.started_at) "
    "FROM {v} WHERE attempts.run_id = %(run_id)s AND attempts.seq = v.column1 "
    "AND attempts.finished_at IS NULL"
)
ADD_ACKED_RECEIPTS = (
    "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, evidence, "
    "recorded_at) SELECT i.idempotency_key, i.intent_digest, v.column7, v.column8, "
    "v.column9, %(at)s FROM {v} JOIN items AS i ON i.run_id = %(run_id)s AND i.seq = v.column1"
)
MOVE_ACKED_ITEMS = (
    "UPDATE items SET state = %(target)s, updated_at = %(at)s, next_attempt_at = NULL, "
    "last_error = v.column5, receipt_id = v.column7 FROM {v} "
    "WHERE items.run_id = %(run_id)s AND items.seq = v.column1 "
    f"AND items.state = {state_literal(ItemState.IN_FLIGHT)}"
)


@functools.cache
def claimable(on_list: str, channels: int, held: int) -> str:
    """Up to `%(limit)s` due pending items, locked as claims lock theirs, with the
    suppressions' `on_list` column, leaving out `%(channel0)s`… (`channels` of them) and the
    seqs `%(held0)s`… (`held`)."""
    where = f"run_id = %(run_id)s AND {ACTIVE} AND state = 'pending' "
    where += f"AND (next_attempt_at IS NULL OR next_attempt_at <= %(at)s) AND {DUE}"
    if channels:
        where += f" AND channel NOT IN ({numbered('channel', channels)})"
    if held:
        where += f" AND seq NOT IN ({numbered('held', held)})"
    return (
        f"SELECT *, {on_list} FROM items WHERE {where} ORDER BY seq LIMIT %(limit)s {{claim_lock}}"
    )


def numbered(name: str, n: int) -> str:
    """`%(name0)s, %(name1)s`… n parameters, for an IN list."""
    return ", ".join(f"%({name}{i})s" for i in range(n))


LAST_ATTEMPT_FINISHED = (
    "SELECT finished_at FROM attempts WHERE run_id = %(run_id)s AND seq = %(seq)s "
    "ORDER BY n DESC LIMIT 1"
)


@functools.cache
def claim_items(n: int) -> str:
    """The claim's conditional move of the n items `%(seq0)s`…, read pending."""
    return (
        "UPDATE items SET state = %(target)s, updated_at = %(at)s, attempts = attempts + 1, "
        "next_attempt_at = NULL, worker_id = %(worker_id)s "
        f"WHERE run_id = %(run_id)s AND seq IN ({numbered('seq', n)}) "
        f"AND state = {state_literal(ItemState.PENDING)}"
    )


@functools.cache
def open_attempts(n: int) -> str:
    """An attempt row for each of the n claimed items `%(seq0)s`…, with how long it waited
    `%(waited0)s`…. n counts attempt rows, not the item's attempts: a released attempt
    (claimed, never started) keeps its row but is not counted as an attempt."""
    values = ", ".join(
        ["(%(seq0)s, CAST(%(waited0)s AS DOUBLE PRECISION))"]
        + [f"(%(seq{i})s, %(waited{i})s)" for i in range(1, n)]
    )
    return (
        "INSERT INTO attempts (run_id, seq, n, started_at, waited_s) "
        "SELECT %(run_id)s, v.column1, (SELECT COALESCE(MAX(n), 0) + 1 FROM attempts AS a "
        "WHERE a.run_id = %(run_id)s AND a.seq = v.column1), %(at)s, v.column2 "
        f"FROM (VALUES {values}) AS v"
    )


CLOSE_ATTEMPT = (
    "UPDATE attempts SET finished_at = %(finished_at)s, outcome = %(outcome)s, "
    "http_status = %(http_status)s, error = %(error)s, retry_after_s = %(retry_after_s)s, "
    "started_at = COALESCE(%(started_at)s, started_at) "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND finished_at IS NULL"
)
# The latest time any worker's downstream asked the channel to stay away.
CLOSE_GATE = (
    "INSERT INTO channel_gates (run_id, channel, closed_until) "
    "SELECT run_id, channel, %(closed_until)s FROM items WHERE run_id = %(run_id)s "
    "AND seq = %(seq)s "
    "ON CONFLICT (run_id, channel) DO UPDATE SET closed_until = excluded.closed_until "
    "WHERE channel_gates.closed_until < excluded.closed_until"
)
# The receipt carries the digest stored with the intent, copied in SQL.
ADD_RECEIPT = (
    "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, "
    "evidence, recorded_at) SELECT idempotency_key, intent_digest, %(receipt_id)s, "
    "%(source)s, %(evidence)s, %(at)s FROM items WHERE run_id = %(run_id)s AND seq = %(seq)s"
)
# Claimed but never started: it does not count as an attempt.
UNCOUNT_ATTEMPT = (
    "UPDATE items SET attempts = attempts - 1 WHERE run_id = %(run_id)s AND seq = %(seq)s "
    "AND state = 'in_flight' AND attempts > 0"
)
ITEM_STATE = "SELECT state FROM items WHERE run_id = %(run_id)s AND seq = %(seq)s"
ADD_DECISION = (
    "INSERT INTO decisions (run_id, seq, operator, at, decision, evidence) "
    "VALUES (%(run_id)s, %(seq)s, %(operator)s, %(at)s, %(decision)s, %(evidence)s)"
)
RENEW_APPROVAL = (
    "UPDATE runs SET approval = %(approval)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND state = %(state)s"
)
REQUEST_CANCEL = (
    "UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, %(at)s), "
    "updated_at = %(at)s WHERE run_id = %(run_id)s AND state NOT IN ({})"
).format(", ".join(f"'{s.value}'" for s in FINISHED_RUN_STATES))

# ---------------------------------------------------------------- planning.py

RUN_EXISTS = "SELECT 1 FROM runs WHERE run_id = %(run_id)s"
# m004's counters: moves are counted by trigger, a plan's inserts here (once, not per row).
COUNT_PLANNED = (
    "INSERT INTO run_counts (run_id, state, n) VALUES (%(run_id)s, 'pending', %(n)s) "
    "ON CONFLICT (run_id, state) DO UPDATE SET n = run_counts.n + excluded.n"
)


def staged_digests(stage: str) -> str:
    """The intent digests left in the plan's stage table `stage`, in seq order."""
    return f"SELECT intent_digest FROM {stage} ORDER BY seq"


def copy_stage(stage: str, pending_columns: str, item_columns: str) -> str:
    """A plan's staged intents (stage.py's columns) as pending items of `%(run_id)s`, the
    database copying the rows itself."""
    return (
        f"INSERT INTO items ({pending_columns}) SELECT %(run_id)s, {item_columns}, %(at)s, "
        f"'pending', 0 FROM {stage} ORDER BY seq"
    )


# ---------------------------------------------------------------- history.py

# Refused rows listed by name in a message; the rest are counted.
LISTED = 10


def _per_row(stage: str) -> str:
    """Per staged row (s), the newest earlier run (by runs.rowid) in which each verdict's
    condition holds, NULL where it holds in none. Each column is non-NULL exactly when its
    verdict applies, so the first non-NULL one, in history.py's order, is the row's verdict."""
    return f"""
SELECT s.seq AS seq, s.item_id AS item_id,
    MAX(CASE WHEN p.state IN ('pending', 'in_flight', 'unknown')
        AND r.state NOT IN ('completed', 'cancelled') THEN r.rowid END) AS open_in,
    MAX(CASE WHEN p.state IN ('in_flight', 'unknown') THEN r.rowid END) AS unsettled_in,
    MAX(CASE WHEN p.state = 'sent' AND p.intent_digest = s.intent_digest
        THEN r.rowid END) AS delivered_in,
    MAX(CASE WHEN p.state = 'sent' THEN r.rowid END) AS changed_in,
    MAX(r.rowid) AS earlier
FROM {stage} s {{ordered_join}} items p ON p.channel = s.channel AND p.identity = s.identity
JOIN runs r ON r.run_id = p.run_id
GROUP BY s.seq, s.item_id
"""


_VERDICT = f"""CASE WHEN open_in IS NOT NULL THEN '{OPEN}'
    WHEN unsettled_in IS NOT NULL THEN '{UNSETTLED}'
    WHEN delivered_in IS NOT NULL THEN '{DELIVERED}'
    WHEN changed_in IS NOT NULL THEN '{CHANGED}' ELSE '{RETRIED}' END"""


def verdicts_by_run(stage: str) -> str:
    """How many staged rows of `stage` get each verdict, by the earlier run it names."""
    return f"""
SELECT v.verdict, r.run_id, COUNT(*) FROM (
    SELECT {_VERDICT} AS verdict,
        COALESCE(open_in, unsettled_in, delivered_in, changed_in, earlier) AS run_rowid
    FROM ({_per_row(stage)}) AS m
) AS v JOIN runs r ON r.rowid = v.run_rowid
GROUP BY v.verdict, r.run_id
ORDER BY v.verdict, MIN(r.rowid)
"""


def changed_rows(stage: str) -> str:
    """The first LISTED staged rows of `stage` whose verdict is `changed`."""
    return f"""
SELECT seq, item_id FROM ({_per_row(stage)}) AS m
WHERE {_VERDICT} = '{CHANGED}' ORDER BY seq LIMIT {LISTED}
"""


def drop_delivered(stage: str) -> str:
    """Staged rows already delivered with the same content: taken out of the stage, so what
    is copied into the run is exactly what is left to send."""
    return f"""
DELETE FROM {stage} WHERE EXISTS (SELECT 1 FROM items p
    WHERE p.channel = {stage}.channel AND p.identity = {stage}.identity
    AND p.state = 'sent' AND p.intent_digest = {stage}.intent_digest)
"""


# ---------------------------------------------------------------- suppressions.py


def listed(name: str, n: int) -> str:
    """`%(name0)s, %(name1)s, …`: the n parameters of an IN list (bound by `bound`)."""
    return ", ".join(f"%({name}{k})s" for k in range(n))


def bound(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The values of an IN list written by `listed`, by name."""
    return {f"{name}{k}": value for k, value in enumerate(values)}


def on_list(dialect: Dialect) -> str:
    """A column for the claim's SELECT (ledger.py): whether the row's recipient is on the
    list, as far as SQL can tell (the dialect's form of suppression.address_key)."""
    address = dialect.address_of.format("items.target")
    return f"EXISTS (SELECT 1 FROM suppressions s WHERE s.address = {address}) AS on_list"


# An address already on the list keeps its row (its first reason and source).
ADD_SUPPRESSION = (
    "INSERT INTO suppressions (address, reason, source, operator, created_at) "
    "VALUES (%(address)s, %(reason)s, %(source)s, %(operator)s, %(at)s) "
    "ON CONFLICT (address) DO NOTHING"
)
SUPPRESSION_OF = "SELECT reason, source FROM suppressions WHERE address = %(address)s"
DELETE_SUPPRESSION = "DELETE FROM suppressions WHERE address = %(address)s"
AUDIT_SUPPRESSION = (
    "INSERT INTO suppression_audit (at, operator, action, address, source, reason, run_id) "
    "VALUES (%(at)s, %(operator)s, %(action)s, %(address)s, %(source)s, %(reason)s, "
    "%(run_id)s)"
)
ALL_SUPPRESSIONS = (
    "SELECT address, reason, source, operator, created_at FROM suppressions ORDER BY address"
)
SUPPRESSION_AUDIT = (
    "SELECT at, operator, action, address, source, reason, run_id FROM suppression_audit "
    "ORDER BY id"
)
ANY_SUPPRESSION = "SELECT 1 FROM suppressions LIMIT 1"


def suppress_planned(dialect: Dialect, current: ItemState) -> str:
    """A new run's items in `current` whose recipient is on the list, moved (one pass over
    the run's items, each looked up by the list's primary key)."""
    address = dialect.address_of.format("target")
    return (
        "UPDATE items SET state = %(target)s, updated_at = %(at)s, last_error = %(error)s "
        f"WHERE run_id = %(run_id)s AND state = {state_literal(current)} AND "
        f"{address} IN (SELECT address FROM suppressions)"
    )


SEQS_IN_STATE = "SELECT seq FROM items WHERE run_id = %(run_id)s AND state = %(state)s ORDER BY seq"


def suppressed_among(n: int) -> str:
    """Those of n addresses (keys, `%(a0)s`…) that are on the list."""
    return f"SELECT address FROM suppressions WHERE address IN ({listed('a', n)})"


def attempted_maybe_delivered(n: int) -> str:
    """Those of a run's n items (`%(s0)s`…, pending) with an attempt that may have been
    delivered."""
    return (
        f"SELECT i.seq FROM items i WHERE i.run_id = %(run_id)s AND i.seq IN ({listed('s', n)}) "
        f"AND i.attempts > 0 AND {MAYBE_DELIVERED}"
    )


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

RUNS_WITH_FINGERPRINT = (
    "SELECT * FROM runs WHERE fingerprint = %(fingerprint)s ORDER BY created_at DESC, rowid DESC"
)
RUN_FLAGS = "SELECT cancel_requested_at, lease_version FROM runs WHERE run_id = %(run_id)s"
RUN_SIGNALS = "SELECT cancel_requested_at, state FROM runs WHERE run_id = %(run_id)s"
# Items per state from m004's counters; before m004 (opened read-only), counted row by row.
RUN_COUNTS = "SELECT state, n FROM run_counts WHERE run_id = %(run_id)s"
ITEM_COUNTS = "SELECT state, COUNT(*) FROM items WHERE run_id = %(run_id)s GROUP BY state"
PER_CHANNEL = "SELECT channel, COUNT(*) FROM items WHERE run_id = %(run_id)s GROUP BY channel"
ITEMS = "SELECT * FROM items WHERE run_id = %(run_id)s ORDER BY seq"


def items_in_states(states: Sequence[ItemState]) -> str:
    """A run's items in one of `states` (bound as `%(s0)s`…), by seq. Repeating a partial
    index's own condition lets SQLite use it: the attention index for in_flight/unknown/
    failed (never a walk over a million pending items), else the active one."""
    if all(s in ATTENTION_STATES for s in states):
        among = f"{{indexed_items_attention}} WHERE run_id = %(run_id)s AND {ATTENTION}"
    elif all(s in ACTIVE_ITEM_STATES for s in states):
        among = f"WHERE run_id = %(run_id)s AND {ACTIVE}"
    else:
        among = "WHERE run_id = %(run_id)s"
    return f"SELECT * FROM items {among} AND state IN ({listed('s', len(states))}) ORDER BY seq"


def items_with_receipts(states: Sequence[ItemState]) -> str:
    """A run's items (in one of `states`, unless none is given) by seq, each with its
    receipt's source and evidence (NULL without one)."""
    chosen = ""
    if states:
        chosen = f" AND i.state IN ({', '.join(state_literal(s) for s in states)})"
    return (
        "SELECT i.*, r.source AS receipt_source, r.evidence AS receipt_evidence "
        "FROM items i LEFT JOIN receipts r ON r.idempotency_key = i.idempotency_key "
        f"WHERE i.run_id = %(run_id)s{chosen} ORDER BY i.seq"
    )


ITEM = "SELECT * FROM items WHERE run_id = %(run_id)s AND seq = %(seq)s"
ITEM_BY_ID = "SELECT * FROM items WHERE run_id = %(run_id)s AND item_id = %(item_id)s"
# Per channel, the latest next_attempt_at of a pending item whose last attempt was throttled;
# through items_waiting and attempts_throttled (m004): only the waiting and throttled rows.
THROTTLED_WAITING = (
    "SELECT i.channel, MAX(i.next_attempt_at) FROM items i "
    "WHERE i.run_id = %(run_id)s AND i.state = 'pending' "
    "AND i.next_attempt_at IS NOT NULL AND (SELECT a.outcome FROM attempts a "
    "WHERE a.run_id = i.run_id AND a.seq = i.seq ORDER BY a.n DESC LIMIT 1) "
    "= 'throttled' GROUP BY i.channel"
)
# Every throttled attempt that asked its channel to wait, and for how long.
THROTTLED_ATTEMPTS = (
    "SELECT i.channel, a.finished_at, a.retry_after_s FROM attempts a "
    "JOIN items i ON i.run_id = a.run_id AND i.seq = a.seq "
    "WHERE a.run_id = %(run_id)s AND a.outcome = 'throttled' AND a.finished_at IS NOT NULL "
    "AND a.retry_after_s IS NOT NULL ORDER BY a.run_id, a.seq"
)
CHANNEL_GATES = "SELECT channel, closed_until FROM channel_gates WHERE run_id = %(run_id)s"
# Through m004's items_retried and events_disproof: only the retried items, and only the
# disproving events of each, are read (never every pending item or every event). Named,
# because without statistics SQLite prefers items_pending_channel, which holds every pending
# item: 0.45 s on a run of a million not yet started.
PENDING_KINDS = (
    f"SELECT i.seq, {MAYBE_DELIVERED} FROM items i {{indexed_items_retried}} "
    "WHERE i.run_id = %(run_id)s AND i.state = 'pending' AND i.attempts > 0"
)


def maybe_delivered_among(n: int) -> str:
    """Those of a run's n items (`%(s0)s`…) that may have reached their recipient."""
    return (
        f"SELECT i.seq FROM items i WHERE i.run_id = %(run_id)s AND i.seq IN ({listed('s', n)}) "
        f"AND {MAYBE_DELIVERED}"
    )


# The claim's condition that an item's start time has come (waiting.DUE), at `%(at)s`.
_DUE_AT = "(not_before IS NULL OR not_before <= %(at)s)"


def earliest_pending(windowed: bool) -> str:
    """Per channel, the earliest next_attempt_at of the run's pending items ('' for due
    now) that are due at `%(at)s` (all of them, not `windowed`: before m009, no start
    times); one pass over them, where no index serves a probe per channel."""
    due = _DUE_AT if windowed else "1 = 1"
    return (
        "SELECT channel, MIN(COALESCE(next_attempt_at, '')) FROM items "
        f"WHERE run_id = %(run_id)s AND {ACTIVE} AND state = 'pending' AND {due} "
        "GROUP BY channel"
    )


def first_pending(windowed: bool) -> str:
    """The earliest next_attempt_at of the channel's pending items due at `%(at)s` (NULL,
    due now, sorts first): one probe of items_pending_channel."""
    due = _DUE_AT if windowed else "1 = 1"
    return (
        "SELECT next_attempt_at FROM items {indexed_items_pending_channel} "
        f"WHERE run_id = %(run_id)s AND state = 'pending' AND channel = %(channel)s AND {due} "
        "ORDER BY next_attempt_at LIMIT 1"
    )


def waiting_for_query(due_by: bool, worker: bool) -> str:
    """A run's unknown items waiting for their channel's query_delay; with `due_by`, those due
    by `%(due_by)s`; with `worker`, those of `%(worker_id)s`. items_attention (m004) holds
    the unknown items: never a walk over the pending ones."""
    return (
        "SELECT * FROM items {indexed_items_attention} WHERE run_id = %(run_id)s "
        f"AND {ATTENTION} AND state = 'unknown' AND next_attempt_at IS NOT NULL"
        + (" AND next_attempt_at <= %(due_by)s" if due_by else "")
        + (" AND worker_id = %(worker_id)s" if worker else "")
        + " ORDER BY seq"
    )


def attempts(of_one: bool) -> str:
    """A run's attempts (`of_one`: of the item `%(seq)s`), in the order made."""
    return (
        "SELECT seq, n, started_at, finished_at, outcome, http_status, error, waited_s, "
        "retry_after_s FROM attempts WHERE run_id = %(run_id)s"
        + (" AND seq = %(seq)s" if of_one else "")
        + " ORDER BY id"
    )


# One pass over the run's attempts (their unique index leads with run_id).
ATTEMPT_TALLY = (
    "SELECT i.channel, a.outcome, COUNT(*) FROM attempts a JOIN items i "
    "ON i.run_id = a.run_id AND i.seq = a.seq "
    "WHERE a.run_id = %(run_id)s AND a.outcome IS NOT NULL GROUP BY i.channel, a.outcome"
)
DECISIONS = (
    "SELECT d.seq, i.item_id, d.operator, d.at, d.decision, d.evidence "
    "FROM decisions d JOIN items i ON i.run_id = d.run_id AND i.seq = d.seq "
    "WHERE d.run_id = %(run_id)s ORDER BY d.id"
)

# ---------------------------------------------------------------- waiting.py

# The claim's extra condition: the item's start time, if any, has come by `%(at)s`.
DUE = "(not_before IS NULL OR not_before <= %(at)s)"
# A pending item outside its window waits for the window's next opening (no state moves).
REOPEN = (
    "UPDATE items SET not_before = %(not_before)s WHERE run_id = %(run_id)s AND seq = %(seq)s "
    "AND state = 'pending'"
)
# An index probe: items_not_before.
NEXT_OPENING = (
    "SELECT MIN(not_before) FROM items WHERE run_id = %(run_id)s AND channel = %(channel)s "
    "AND state = 'pending' AND not_before IS NOT NULL AND not_before > %(at)s"
)
WAITING = (
    "SELECT COUNT(*), MIN(not_before) FROM items WHERE run_id = %(run_id)s "
    "AND state = 'pending' AND not_before IS NOT NULL AND not_before > %(at)s"
)

# ---------------------------------------------------------------- buckets.py

# A channel's bucket, full (at most max(1, rate) tokens), unless a worker made it already.
OPEN_BUCKET = (
    "INSERT INTO rate_buckets (run_id, channel, tokens, refilled_at) VALUES "
    "(%(run_id)s, %(channel)s, CAST(%(capacity)s AS DOUBLE PRECISION), {now_s}) "
    "ON CONFLICT DO NOTHING"
)
# The tokens a bucket holds now: refilled at `rate` per second since its last take.
_REFILLED = "{least}(%(capacity)s, tokens + ({now_s} - refilled_at) * %(rate)s)"
# One token taken, or no row when none is left: atomic on its own, never one token for two.
TAKE_TOKEN = (
    f"UPDATE rate_buckets SET tokens = {_REFILLED} - 1, refilled_at = {{now_s}} "
    f"WHERE run_id = %(run_id)s AND channel = %(channel)s AND {_REFILLED} >= 1"
)

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

# A group's writes (writes.py) read its VALUES rows as `{v}`, put in here before an engine
# sees the statement. Cached: a group commit sends the same few shapes over and over.


@functools.cache
def separately(writes: tuple[str, ...], values: str) -> tuple[str, ...]:
    """The group's writes as one statement each, `{v}` the VALUES rows themselves."""
    source = f"(VALUES {values}) AS v"
    return tuple(write.replace("{v}", source) for write in writes)


@functools.cache
def as_one(writes: tuple[str, ...], counted: int, returning: str, values: str) -> str:
    """The group's writes as one statement of data-modifying WITHs, `{v}` the WITH naming
    the VALUES rows; it returns `returning` of the rows the write at `counted` moved."""
    parts = [f"v AS (VALUES {values})"] if values else []
    for i, write in enumerate(writes):
        text = write.replace("{v}", "v")
        if i == counted:
            parts.append(f"moved AS ({text} RETURNING {returning})")
        else:
            parts.append(f"w{i} AS ({text})")
    return f"WITH {', '.join(parts)} SELECT seq FROM moved ORDER BY seq"
