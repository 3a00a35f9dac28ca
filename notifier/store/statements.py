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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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

# ---------------------------------------------------------------- drafts.py

# ---------------------------------------------------------------- leases.py

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
