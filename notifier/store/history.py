"""What earlier runs in this database did with the rows of a new plan (issue 21).

A row's identity is its channel and `items.identity` (intent.row_identity). Each staged row
gets one verdict from every earlier item of the same identity, in this order:

- `open`: pending, in flight or unknown in a run not completed or cancelled. The file is
  refused: that run is resumed, never doubled.
- `unsettled`: in flight or unknown in a finished run (cancelled with unknowns): it may have
  been delivered, so it is refused until an operator settles it.
- `delivered`: sent with the same intent digest. Not planned again.
- `changed`: sent, but with different content. Refused unless --resend-changed.
- `retried`: there are earlier items, none delivered (failed, expired, never attempted in a
  cancelled run, marked not-sent, abandoned). Planned again, as a new notification.

One set-based query over the staged plan (joined to items through items_identity) decides
every row at once: a million rows are never compared one by one in Python."""

from __future__ import annotations

from .core import Core
from .prior import CHANGED, DELIVERED, OPEN, RETRIED, UNSETTLED, Prior
from .stage import PlanStage

__all__ = ["CHANGED", "DELIVERED", "OPEN", "RETRIED", "UNSETTLED", "History", "Prior"]

# Refused rows listed by name in a message; the rest are counted.
LISTED = 10

# Per staged row (s), the newest earlier run (by runs.rowid) in which each verdict's
# condition holds, NULL where it holds in none. Each column is non-NULL exactly when its
# verdict applies, so the first non-NULL one, in the order above, is the row's verdict.
_PER_ROW = """
SELECT s.seq AS seq, s.item_id AS item_id,
    MAX(CASE WHEN p.state IN ('pending', 'in_flight', 'unknown')
        AND r.state NOT IN ('completed', 'cancelled') THEN r.rowid END) AS open_in,
    MAX(CASE WHEN p.state IN ('in_flight', 'unknown') THEN r.rowid END) AS unsettled_in,
    MAX(CASE WHEN p.state = 'sent' AND p.intent_digest = s.intent_digest
        THEN r.rowid END) AS delivered_in,
    MAX(CASE WHEN p.state = 'sent' THEN r.rowid END) AS changed_in,
    MAX(r.rowid) AS earlier
FROM {stage} s {join} items p ON p.channel = s.channel AND p.identity = s.identity
JOIN runs r ON r.run_id = p.run_id
GROUP BY s.seq, s.item_id
"""

_VERDICT = f"""CASE WHEN open_in IS NOT NULL THEN '{OPEN}'
    WHEN unsettled_in IS NOT NULL THEN '{UNSETTLED}'
    WHEN delivered_in IS NOT NULL THEN '{DELIVERED}'
    WHEN changed_in IS NOT NULL THEN '{CHANGED}' ELSE '{RETRIED}' END"""

_BY_RUN = f"""
SELECT v.verdict, r.run_id, COUNT(*) FROM (
    SELECT {_VERDICT} AS verdict,
        COALESCE(open_in, unsettled_in, delivered_in, changed_in, earlier) AS run_rowid
    FROM ({_PER_ROW}) AS m
) AS v JOIN runs r ON r.rowid = v.run_rowid
GROUP BY v.verdict, r.run_id
ORDER BY v.verdict, MIN(r.rowid)
"""

_CHANGED_ROWS = f"""
SELECT seq, item_id FROM ({_PER_ROW}) AS m
WHERE {_VERDICT} = '{CHANGED}' ORDER BY seq LIMIT {LISTED}
"""

# Staged rows already delivered with the same content: taken out of the stage, so what is
# copied into the run is exactly what is left to send.
_DROP_DELIVERED = """
DELETE FROM {stage} WHERE EXISTS (SELECT 1 FROM items p
    WHERE p.channel = {stage}.channel AND p.identity = {stage}.identity
    AND p.state = 'sent' AND p.intent_digest = {stage}.intent_digest)
"""


class History:
    """Comparing a staged plan with every earlier run of the database."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def compare_plan(self, stage: PlanStage) -> Prior:
        """What `send` would decide for `stage`, reading only (for --dry-run). A database
        from before m006 has no identities yet: every row reads as new there, until the next
        send migrates it."""
        if "identity" not in self.core.engine.columns("items"):
            return Prior(stage.count)
        try:
            with self.core.snapshot():
                return self.compare(self.core.engine.stage_table(stage), stage.count)
        finally:
            self.core.engine.release_stage()

    def compare(self, stage: str, total: int) -> Prior:
        by_run: dict[str, dict[str, int]] = {}
        sql = _BY_RUN.format(stage=stage, join=self.core.dialect.ordered_join)
        for verdict, run_id, n in self.core.conn.execute(sql).fetchall():
            by_run.setdefault(verdict, {})[run_id] = int(n)
        changed: list[tuple[int, str]] = []
        if CHANGED in by_run:
            sql = _CHANGED_ROWS.format(stage=stage, join=self.core.dialect.ordered_join)
            changed = [(int(seq), item_id) for seq, item_id in self.core.conn.execute(sql)]
        return Prior(total, by_run, changed)

    def drop_delivered(self, stage: str) -> None:
        self.core.conn.execute(_DROP_DELIVERED.format(stage=stage))
