"""The statements of store/chunks.py (their notation: statements/__init__.py)."""

from __future__ import annotations

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
