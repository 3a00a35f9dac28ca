"""The statements of store/buckets.py (their notation: statements/__init__.py)."""

from __future__ import annotations

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
