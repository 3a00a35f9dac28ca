"""The statements of store/waiting.py (their notation: statements/__init__.py)."""

from __future__ import annotations

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
