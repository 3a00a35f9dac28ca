"""The statements of store/leases.py (their notation: statements/__init__.py)."""

from __future__ import annotations

from notifier.store.statements import listed

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


def live_workers(pid_space: bool) -> str:
    """Each live worker, and how many items it holds in flight; its pid space NULL where the
    database, opened read-only, is from before m015 (`pid_space` False)."""
    space = "pid_space" if pid_space else "NULL AS pid_space"
    return (
        f"SELECT worker_id, run_id, host, pid, process_start, {space}, state, version, "
        "joined_at, heartbeat_at, expires_at, (SELECT COUNT(*) FROM items i "
        f"WHERE i.run_id = w.run_id AND i.{HELD} AND i.state = 'in_flight' "
        "AND i.worker_id = w.worker_id) "
        "FROM workers w WHERE w.run_id = %(run_id)s AND w.state = 'live' ORDER BY w.joined_at"
    )


def adopt_items(n: int) -> str:
    """Items `%(s0)s`… `%(s{n-1})s` of the run now held by the worker adopting them."""
    seqs = listed("s", n)
    return (
        f"UPDATE items SET worker_id = %(worker_id)s WHERE run_id = %(run_id)s AND seq IN ({seqs})"
    )


# Items in flight or unknown that no live worker holds.
_ORPHANED = (
    "FROM items i WHERE i.run_id = %(run_id)s AND i.state IN ('in_flight', 'unknown') "
    "AND (i.worker_id IS NULL OR i.worker_id != %(worker_id)s) AND NOT EXISTS "
    "(SELECT 1 FROM workers w WHERE w.worker_id = i.worker_id AND w.state = 'live') "
    "ORDER BY seq"
)
ORPHANS = f"SELECT seq {_ORPHANED}"
# The same items, each with the worker that held it and that worker's state (reaped: fenced
# out as dead; released: it exited; NULL: held by no worker).
ORPHANS_HELD = (
    "SELECT i.seq, i.worker_id, (SELECT w.state FROM workers w WHERE w.worker_id = "
    f"i.worker_id) {_ORPHANED}"
)
LEAVE_RUN = (
    "UPDATE workers SET state = 'released' WHERE worker_id = %(worker_id)s AND state = 'live'"
)
HELD_IN_FLIGHT = (
    "SELECT seq FROM items WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s "
    "AND state = 'in_flight' ORDER BY seq"
)
HOLDS_UNKNOWN = (
    "SELECT 1 FROM items WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s "
    f"AND {HELD} AND state = 'unknown' AND next_attempt_at IS NOT NULL LIMIT 1"
)
# A reap takes the dead worker's row FOR UPDATE first: the one row lock that conflicts with
# its fence (FOR KEY SHARE, held by a transaction of that worker until COMMIT), which a
# plain UPDATE of these columns would not wait for. Only the lease that was judged dead is
# reaped (its expiry as read): a renewal that committed since then stands, for its holder
# was told its lease is good.
_REAPABLE = (
    "SELECT worker_id FROM workers "
    "WHERE worker_id = %(worker_id)s AND version = %(version)s AND state = 'live' "
    "AND expires_at = %(expires_at)s"
)
_REAP = "UPDATE workers SET state = 'reaped', version = version + 1 WHERE worker_id IN "
# Waiting while the dead worker's transaction is open: at most until the server ends that
# session (postgres.py, IDLE_IN_WRITE_S), well within the lock timeout.
REAP_WORKER = _REAP + "(" + _REAPABLE + " {reap_lock})"
# Skipping a worker whose transaction is open: a live worker's committer never waits on a
# dead one's locks (it tries again at its next look for dead workers).
REAP_WORKER_UNLESS_BUSY = _REAP + "(" + _REAPABLE + " {claim_lock})"
