"""The statements of store/suppressions.py (their notation: statements/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from notifier.domain.state_machine import ItemState
from notifier.store.statements import MAYBE_DELIVERED, listed, state_literal

if TYPE_CHECKING:
    from notifier.store.backend import Dialect


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
