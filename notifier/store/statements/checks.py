"""The statements of store/checks.py (their notation: statements/__init__.py)."""

from __future__ import annotations

from notifier.store.statements import ACTIVE, ATTENTION

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
EVENTS_UP_TO = "SELECT COUNT(*) FROM events WHERE run_id = %(run_id)s AND seq_no <= %(seq_no)s"
EVENTS_AFTER = "SELECT COUNT(*) FROM events WHERE run_id = %(run_id)s AND seq_no > %(seq_no)s"
RECEIPT_COUNT = "SELECT COUNT(*) FROM receipts"
SENT_COUNT = "SELECT COALESCE(SUM(n), 0) FROM run_counts WHERE state = 'sent'"
