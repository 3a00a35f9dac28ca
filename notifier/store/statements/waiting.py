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
# What `status` counts as waiting: an item past its deadline waits for nothing (it is expired,
# never sent, when the run next goes on).
_KEPT = "(not_after IS NULL OR not_after > %(at)s)"
WAITING = (
    "SELECT COUNT(*), MIN(not_before) FROM items WHERE run_id = %(run_id)s "
    f"AND state = 'pending' AND not_before IS NOT NULL AND not_before > %(at)s AND {_KEPT}"
)
# Pending items whose start time has come, by the window and zone they wait on: those whose
# window is closed now wait for its next opening as much as those a claim has moved on. An
# item with a window always has a start time (planning stores both), so this reads the
# partial index items_not_before: nothing at all for a run without start times.
WINDOWS_DUE = (
    "SELECT send_window, send_tz, COUNT(*) FROM items WHERE run_id = %(run_id)s "
    "AND state = 'pending' AND not_before IS NOT NULL AND not_before <= %(at)s "
    f"AND send_window IS NOT NULL AND {_KEPT} GROUP BY send_window, send_tz"
)
