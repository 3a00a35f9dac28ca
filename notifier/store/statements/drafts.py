"""The statements of store/drafts.py (their notation: statements/__init__.py)."""

from __future__ import annotations

INSERT_DRAFT = (
    "INSERT INTO drafts (run_id, seq, line, source, state, source_digest) "
    "VALUES (%(run_id)s, %(seq)s, %(line)s, %(source)s, 'pending', %(digest)s)"
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
