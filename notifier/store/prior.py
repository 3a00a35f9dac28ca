"""A plan's verdicts against earlier runs (history.py decides them): plain data, which the
store's failures (exceptions.PlanRefused) carry without importing the store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

OPEN, UNSETTLED, DELIVERED, ABANDONED, CHANGED, SAME_CONTENT, RETRIED = (
    "open",
    "unsettled",
    "delivered",
    "abandoned",
    "changed",
    "same_content",
    "retried",
)
# Verdicts whose rows are left out of the new run (the rest are planned, or refuse the file).
LEFT_OUT = (DELIVERED, ABANDONED)


@dataclass(frozen=True)
class Prior:
    """A plan's rows against earlier runs: per verdict, how many rows, by the run named for
    them (the newest run in which the verdict holds), oldest run first."""

    total: int  # rows in the plan
    by_run: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    changed_rows: list[tuple[int, str]] = field(default_factory=list)  # (seq, id), first ten
    # Rows of the plan that a rejected run held, by that run: the new run awaits approval.
    rejected_by: Mapping[str, int] = field(default_factory=dict)
    # Set when nothing was stored because every row left is suppressed and was planned
    # before: how many such rows.
    suppressed_only: int = 0

    def count(self, verdict: str) -> int:
        return sum(self.by_run.get(verdict, {}).values())

    def runs(self, verdict: str) -> list[str]:
        return list(self.by_run.get(verdict, {}))

    @property
    def left(self) -> int:
        """Rows that a send would plan (refusals aside); 0 once a plan of nothing but
        suppressed rows was dropped."""
        if self.suppressed_only:
            return 0
        return self.total - sum(self.count(v) for v in LEFT_OUT)

    def refused(self, resend_changed: bool) -> bool:
        return bool(
            self.count(OPEN)
            or self.count(UNSETTLED)
            or ((self.count(CHANGED) or self.count(SAME_CONTENT)) and not resend_changed)
        )
