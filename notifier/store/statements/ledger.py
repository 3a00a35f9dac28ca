"""The statements of store/ledger.py (their notation: statements/__init__.py)."""

from __future__ import annotations

import functools

from notifier.domain.state_machine import FINISHED_RUN_STATES, ItemState
from notifier.store.statements import ACTIVE, DUE, KEPT, MAYBE_DELIVERED, listed, state_literal

REPLACE_STOP_REASON = (
    "UPDATE runs SET stop_reason = %(reason)s, stop_cause = %(cause)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND stop_reason = %(expected)s "
    "AND stop_cause = %(expected_cause)s"
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
ACK_FIELDS = ("seq", "finished", "outcome", "status", "error", "retry", "receipt", "source",
               "evidence", "started")  # fmt: skip


@functools.lru_cache(maxsize=KEPT)
def ack_names(n: int) -> tuple[tuple[str, ...], ...]:
    """The parameters of `ack_values(n)`, row by row, in column order."""
    return tuple(tuple(f"{field}{i}" for field in ACK_FIELDS) for i in range(n))


@functools.lru_cache(maxsize=KEPT)
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


@functools.lru_cache(maxsize=KEPT)
def claimable(on_list: str, channels: int, held: int) -> str:
    """Up to `%(limit)s` due pending items, locked as claims lock theirs, with the
    suppressions' `on_list` column, leaving out `%(channel0)s`… (`channels` of them) and the
    seqs `%(held0)s`… (`held`)."""
    where = f"run_id = %(run_id)s AND {ACTIVE} AND state = 'pending' "
    where += f"AND (next_attempt_at IS NULL OR next_attempt_at <= %(at)s) AND {DUE}"
    if channels:
        where += f" AND channel NOT IN ({listed('channel', channels)})"
    if held:
        where += f" AND seq NOT IN ({listed('held', held)})"
    return (
        f"SELECT *, {on_list} FROM items WHERE {where} ORDER BY seq LIMIT %(limit)s {{claim_lock}}"
    )


LAST_ATTEMPT_FINISHED = (
    "SELECT finished_at FROM attempts WHERE run_id = %(run_id)s AND seq = %(seq)s "
    "ORDER BY n DESC LIMIT 1"
)


@functools.lru_cache(maxsize=KEPT)
def claim_items(n: int) -> str:
    """The claim's conditional move of the n items `%(seq0)s`…, read pending."""
    return (
        "UPDATE items SET state = %(target)s, updated_at = %(at)s, attempts = attempts + 1, "
        "next_attempt_at = NULL, worker_id = %(worker_id)s "
        f"WHERE run_id = %(run_id)s AND seq IN ({listed('seq', n)}) "
        f"AND state = {state_literal(ItemState.PENDING)}"
    )


@functools.lru_cache(maxsize=KEPT)
def open_attempts(n: int) -> str:
    """An attempt row for each of the n claimed items `%(seq0)s`…, with how long it waited
    `%(waited0)s`… (a row whose seq is NULL is padding: statements.padded). n counts attempt
    rows, not the item's attempts: a released attempt (claimed, never started) keeps its row
    but is not counted as an attempt."""
    values = ", ".join(
        ["(%(seq0)s, CAST(%(waited0)s AS DOUBLE PRECISION))"]
        + [f"(%(seq{i})s, %(waited{i})s)" for i in range(1, n)]
    )
    return (
        "INSERT INTO attempts (run_id, seq, n, started_at, waited_s) "
        "SELECT %(run_id)s, v.column1, (SELECT COALESCE(MAX(n), 0) + 1 FROM attempts AS a "
        "WHERE a.run_id = %(run_id)s AND a.seq = v.column1), %(at)s, v.column2 "
        f"FROM (VALUES {values}) AS v WHERE v.column1 IS NOT NULL"
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
# An abandoned item marked not sent stays failed; only its last error changes (no move).
NOTE_RELEASED = (
    "UPDATE items SET last_error = %(error)s, updated_at = %(at)s "
    "WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = 'failed'"
)
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
