"""What earlier runs in this database did with the rows of a new plan.

A row's identity is its channel and `items.identity` (intent.row_identity). Each staged row
gets one verdict from every earlier item of the same identity, in this order:

- `open`: pending, in flight or unknown in a run not completed or cancelled. The file is
  refused: that run is resumed, never doubled.
- `unsettled`: in flight or unknown in a finished run (cancelled with unknowns): it may have
  been delivered, so it is refused until an operator settles it.
- `delivered`: sent with the same intent digest, or, for a row without an id, sent as a
  row of its row digest (its identity: the same content with another deadline or other
  line breaks, intent.row_digest). Not planned again.
- `abandoned`: failed by an operator's `--mark abandon` with the same intent digest (or row
  digest, as above): maybe delivered, so not planned again either (with other content it
  counts as `changed`).
- `changed`: sent, but with different content. Refused unless --resend-changed.
- `same_content`: no earlier item of its own identity, but the row has an id and an id-less
  earlier row had its channel, recipient and content and may have reached the recipient
  (a file sent without an `id` column, then with one). Refused unless --resend-changed:
  whether they are the same notifications is not the tool's to guess.
- `retried`: there are earlier items, none delivered (failed, expired, never attempted in a
  cancelled run, marked not-sent, abandoned). Planned again, as a new notification.

One set-based query over the staged plan (joined to items through items_identity) decides
every row at once: a million rows are never compared one by one in Python."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from notifier.store.core import Core
from notifier.store.prior import (
    ABANDONED,
    CHANGED,
    DELIVERED,
    OPEN,
    RETRIED,
    SAME_CONTENT,
    UNSETTLED,
    Prior,
)
from notifier.store.stage import PlanStage
from notifier.store.statements import history as sql

__all__ = [
    "ABANDONED",
    "CHANGED",
    "DELIVERED",
    "OPEN",
    "RETRIED",
    "SAME_CONTENT",
    "UNSETTLED",
    "Prior",
    "RowHistory",
]


# The verdicts under which another run has, or may have, sent a row, or may still send it:
# every one but `retried`.
_HELD = (OPEN, UNSETTLED, DELIVERED, ABANDONED, CHANGED, SAME_CONTENT)


class RowHistory:
    """Comparing a staged plan with every earlier run of the database."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.engine = core.engine

    def compare_plan(self, stage: PlanStage) -> Prior:
        """What `send` would decide for `stage`, reading only (for --dry-run). A database
        from before m006 has no identities yet: every row reads as new there, until the next
        send migrates it."""
        if "identity" not in self.engine.columns("items"):
            return Prior(stage.count)
        try:
            with self.core.snapshot():
                return self.compare(self.engine.stage_table(stage), stage.count)
        finally:
            self.engine.release_stage()

    def compare_composed(self, stage: PlanStage) -> tuple[Prior, list[int]]:
        """`compare_plan` for the source rows of a `send --compose` (their identities as
        rows of the file, plan.source_identity), reading only, and the seqs of those to leave
        out. A composed row is the same notification whatever was drafted for it, so an
        earlier one sent (or abandoned) with other text is delivered, not changed: the
        comparison's `changed` counts as `delivered` here. Redrafting is `redraft`."""
        if "identity" not in self.engine.columns("items"):
            return Prior(stage.count), []
        try:
            with self.core.snapshot():
                table = self.engine.stage_table(stage)
                prior = self.compare(table, stage.count)
                left_out = (DELIVERED, ABANDONED, CHANGED)
                held = self.engine.execute(sql.held_by_run(table, left_out))
                seqs = [int(seq) for seq, _item_id, _run in held]
                rejected = self.rejected(stage)
        finally:
            self.engine.release_stage()
        by_run = {verdict: dict(runs) for verdict, runs in prior.by_run.items()}
        for run_id, n in by_run.pop(CHANGED, {}).items():
            delivered = by_run.setdefault(DELIVERED, {})
            delivered[run_id] = delivered.get(run_id, 0) + n
        return Prior(stage.count, by_run, rejected_by=rejected), seqs

    def held_elsewhere(self, stage: PlanStage, run_id: str) -> dict[int, str]:
        """Inside a plan's transaction: the staged rows of composed run `run_id` (being
        frozen: none of its items stored yet) another run delivered, abandoned or holds open
        (any verdict but `retried`), each with that run; a row with an id is compared under
        the content it was drafted from too (its draft's source_digest)."""
        table = self.engine.stage_table(stage)
        statement = sql.held_by_run(table, _HELD, other_runs=True)
        held = self.engine.execute(statement, {"run_id": run_id})
        return {int(seq): run for seq, _, run in held}

    def held_by_other_runs(self, run_id: str, seqs: Sequence[int]) -> dict[str, str]:
        """As held_elsewhere, for rows `seqs` already planned in run `run_id`: the ids of
        those another run delivered (whatever its content), abandoned or holds open, each
        with that run."""
        if not seqs:
            return {}
        statement = sql.held_by_run(sql.rows_of_run(len(seqs)), _HELD, other_runs=True)
        params: dict[str, Any] = {"run_id": run_id}
        params.update((f"seq{i}", seq) for i, seq in enumerate(seqs))
        return {str(item_id): run for _, item_id, run in self.engine.execute(statement, params)}

    def compare(self, stage: str, total: int) -> Prior:
        """The verdicts of `stage`'s rows. A database from before m016 or m018, read
        without being migrated (--dry-run), has no index of items by content: there a row
        without an id is compared only under its own identity, as every row of a database
        from before m006 reads as new, until the next send migrates it; one from before m022
        has no row digests of items with ids, and is compared without them."""
        by_content = self.engine.has_index("items_content") and self.engine.has_index(
            "drafts_by_content"
        )
        flags = {
            "by_content": by_content,
            "by_row_digest": self.engine.has_index("items_row_digest"),
        }
        by_run: dict[str, dict[str, int]] = {}
        verdicts = sql.verdicts_by_run(stage, **flags)
        for verdict, run_id, n in self.engine.execute(verdicts).fetchall():
            by_run.setdefault(verdict, {})[run_id] = int(n)
        changed: list[tuple[int, str]] = []
        if CHANGED in by_run:
            rows = self.engine.execute(sql.changed_rows(stage, **flags))
            changed = [(int(seq), item_id) for seq, item_id in rows]
        return Prior(total, by_run, changed)

    def rejected(self, stage: PlanStage) -> dict[str, int]:
        """Per rejected run (`notifier reject`), how many rows of the staged plan it held:
        those rows need approval again. Read inside the plan's transaction; the stage is
        only put in the database when some run was rejected at all."""
        runs = [run_id for (run_id,) in self.engine.execute(sql.REJECTED_RUNS)]
        if not runs:
            return {}
        table = self.engine.stage_table(stage)
        held = {}
        for run_id in runs:
            (n,) = self.engine.execute(sql.held_by(table), {"run_id": run_id}).fetchone()
            if n:
                held[run_id] = int(n)
        return held

    def drop_delivered(self, stage: str) -> None:
        self.engine.execute(sql.drop_delivered(stage))
