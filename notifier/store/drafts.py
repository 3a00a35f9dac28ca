"""Claude drafts (--compose): stored one by one before any digest, then frozen into
intents exactly once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .. import clock
from ..records import Counts, Run, StoredDraft
from ..state_machine import (
    RunTrigger,
)
from .core import Core, _dump
from .exceptions import LostRace
from .planning import Planning
from .stage import PlanStage


class Drafts:
    """The drafts of a --compose run, and the one freeze of its plan."""

    def __init__(self, core: Core, plans: Planning) -> None:
        self.core = core
        self.plans = plans

    def create_drafting_run(
        self, run: dict[str, Any], sources: Sequence[tuple[int, int, str]]
    ) -> None:
        """The run row (fingerprint empty: not frozen yet) and one pending draft per row
        (seq, line, source), in one transaction."""
        at = run["created_at"]
        with self.core.write():
            self.core.insert_row(
                "runs",
                {
                    **run,
                    "fingerprint": "",
                    "channel_snapshot": _dump(run["channel_snapshot"]),
                    "options": _dump(run["options"]),
                    "updated_at": at,
                },
            )
            self.core.conn.executemany(
                "INSERT INTO drafts (run_id, seq, line, source, state) "
                "VALUES (?, ?, ?, ?, 'pending')",
                ((run["run_id"], seq, line, source) for seq, line, source in sources),
            )
            self.core.event(run["run_id"], "planned", None, {"drafts": len(sources)}, at)

    def pending_drafts(self, run_id: str) -> list[tuple[int, str]]:
        return [
            (seq, source)
            for seq, source in self.core.conn.execute(
                "SELECT seq, source FROM drafts WHERE run_id = ? AND state = 'pending' "
                "ORDER BY seq",
                (run_id,),
            )
        ]

    def save_draft(self, run_id: str, seq: int, draft: dict[str, Any]) -> None:
        """A draft, durable before any digest is computed from it; only ever once per row."""
        at = clock.now_iso()
        with self.core.write():
            cursor = self.core.conn.execute(
                "UPDATE drafts SET state = 'drafted', subject = ?, body = ?, model = ?, "
                "input_tokens = ?, output_tokens = ?, error = NULL, drafted_at = ? "
                "WHERE run_id = ? AND seq = ? AND state = 'pending'",
                (
                    draft["subject"],
                    draft["body"],
                    draft["model"],
                    draft["input_tokens"],
                    draft["output_tokens"],
                    at,
                    run_id,
                    seq,
                ),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} row {seq}: already drafted")
            self.core.event(run_id, "drafted", seq, {"model": draft["model"]}, at)

    def save_result(self, run_id: str, seq: int, draft: dict[str, Any]) -> bool:
        """A batch result's draft, only if the row has none yet (streaming a batch's results
        again after a crash stores nothing twice). Whether it was stored."""
        try:
            self.save_draft(run_id, seq, draft)
        except LostRace:
            return False
        return True

    def fail_result(
        self, run_id: str, seq: int, error: str, usage: tuple[str, int, int] | None = None
    ) -> bool:
        """A batch result's failure, only if the row has no draft yet."""
        try:
            self.fail_draft(run_id, seq, error, usage=usage)
        except LostRace:
            return False
        return True

    def fail_draft(
        self,
        run_id: str,
        seq: int,
        error: str,
        expected: str = "pending",
        usage: tuple[str, int, int] | None = None,
    ) -> None:
        """The row's draft failed for `error`; `usage` (model, tokens in, out) is what the
        unusable answer cost, counted with the run's tokens all the same."""
        at = clock.now_iso()
        with self.core.write():
            if usage is not None:
                self.core.conn.execute(
                    "UPDATE drafts SET model = ?, input_tokens = ?, output_tokens = ? "
                    "WHERE run_id = ? AND seq = ? AND state = ?",
                    (*usage, run_id, seq, expected),
                )
            cursor = self.core.conn.execute(
                "UPDATE drafts SET state = 'failed', error = ?, drafted_at = ? "
                "WHERE run_id = ? AND seq = ? AND state = ?",
                (error, at, run_id, seq, expected),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} row {seq}: expected draft {expected}")
            self.core.event(run_id, "draft_failed", seq, {"error": error}, at)

    def note_drafting(self, run_id: str, kind: str, detail: Mapping[str, Any]) -> None:
        """An event of the run's drafting for the audit (an interruption, a redraft)."""
        at = clock.now_iso()
        with self.core.write():
            self.core.event(run_id, kind, None, dict(detail), at)

    def set_compose_model(self, run_id: str, model: str) -> tuple[str, int]:
        """`resume --model`: the model for the rows not drafted yet (the drafts made keep
        theirs, recorded per row). Returns the model it replaces and how many rows it
        will draft."""
        at = clock.now_iso()
        with self.core.write():
            row = self.core.conn.execute(
                "SELECT options FROM runs WHERE run_id = ? AND fingerprint = '' "
                f"{self.core.dialect.row_lock}",
                (run_id,),
            ).fetchone()
            if row is None:
                raise LostRace(f"run {run_id}: its drafts are already frozen")
            options = json.loads(row[0])
            before = str(options["compose"]["model"])
            options["compose"]["model"] = model
            self.core.conn.execute(
                "UPDATE runs SET options = ?, updated_at = ? WHERE run_id = ?",
                (_dump(options), at, run_id),
            )
            (pending,) = self.core.conn.execute(
                "SELECT COUNT(*) FROM drafts WHERE run_id = ? AND state = 'pending'", (run_id,)
            ).fetchone()
            self.core.event(run_id, "model_changed", None, {"from": before, "to": model}, at)
        return before, int(pending)

    def apply_redraft(
        self,
        run_id: str,
        before: str,
        fingerprint: str,
        content_fingerprint: str,
        rows: Sequence[tuple[int, Mapping[str, Any], str, str, str | None]],
        operator: str,
    ) -> None:
        """`notifier redraft`: each row's new draft (seq, draft, payload JSON, digest,
        identity) and its recomputed intent, the run's new fingerprints and its approval
        cleared, in one transaction, only while the run still awaits approval with the
        fingerprint `before` (LostRace otherwise, nothing written). The key stays: it names
        the row's slot, and nothing was sent under it. Tokens add up: both drafts were paid."""
        at = clock.now_iso()
        with self.core.write():
            cursor = self.core.conn.execute(
                "UPDATE runs SET fingerprint = ?, content_fingerprint = ?, approval = NULL, "
                "updated_at = ? WHERE run_id = ? AND state = 'awaiting_approval' "
                "AND fingerprint = ?",
                (fingerprint, content_fingerprint, at, run_id, before),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} changed while it was being redrafted")
            for seq, draft, payload, digest, identity in rows:
                self.core.conn.execute(
                    "UPDATE drafts SET state = 'drafted', subject = ?, body = ?, model = ?, "
                    "input_tokens = COALESCE(input_tokens, 0) + ?, "
                    "output_tokens = COALESCE(output_tokens, 0) + ?, error = NULL, "
                    "drafted_at = ? WHERE run_id = ? AND seq = ?",
                    (draft["subject"], draft["body"], draft["model"], draft["input_tokens"],
                     draft["output_tokens"], at, run_id, seq),
                )  # fmt: skip
                # A row whose first draft failed is planned again (m004's trigger moves
                # its count); one ever attempted is not touched (LostRace).
                moved = self.core.conn.execute(
                    "UPDATE items SET payload = ?, intent_digest = ?, identity = ?, "
                    "state = 'pending', last_error = NULL, updated_at = ? "
                    "WHERE run_id = ? AND seq = ? AND state IN ('pending', 'failed') "
                    "AND attempts = 0",
                    (payload, digest, identity, at, run_id, seq),
                )
                if moved.rowcount != 1:
                    raise LostRace(f"run {run_id} row {seq}: its intent was already used")
                self.core.event(run_id, "redrafted", seq, {"model": draft["model"],
                                                       "intent_digest": digest}, at)  # fmt: skip
            self.core.event(
                run_id,
                "redraft",
                None,
                {"operator": operator, "rows": [seq for seq, *_ in rows],
                 "fingerprint_before": before, "fingerprint": fingerprint},
                at,
            )  # fmt: skip

    def drafts(self, run_id: str) -> list[StoredDraft]:
        return [
            StoredDraft(*tuple(r))
            for r in self.core.conn.execute(
                "SELECT seq, line, source, state, subject, body, model, input_tokens, "
                "output_tokens, error FROM drafts WHERE run_id = ? ORDER BY seq",
                (run_id,),
            )
        ]

    def draft_summary(self, run_id: str) -> dict[str, int]:
        summary = {"total": 0, "drafted": 0, "failed": 0, "pending": 0}
        for state, n in self.core.conn.execute(
            "SELECT state, COUNT(*) FROM drafts WHERE run_id = ? GROUP BY state", (run_id,)
        ):
            summary[state] = n
            summary["total"] += n
        tokens = self.core.conn.execute(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) "
            "FROM drafts WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        summary["input_tokens"], summary["output_tokens"] = int(tokens[0]), int(tokens[1])
        return summary

    def draft_failures(self, run_id: str) -> list[tuple[int, int, str]]:
        """(seq, line, error) of every row whose draft failed."""
        return [
            (seq, line, error)
            for seq, line, error in self.core.conn.execute(
                "SELECT seq, line, error FROM drafts WHERE run_id = ? AND state = 'failed' "
                "ORDER BY seq",
                (run_id,),
            )
        ]

    def freeze_plan(
        self,
        run_id: str,
        fingerprint: str,
        content_fingerprint: str,
        items: Sequence[dict[str, Any]] | PlanStage,
        then: RunTrigger | None = None,
        failed: Mapping[int, str] | None = None,
    ) -> None:
        """The intents computed from the stored drafts and the run's fingerprint, in one
        transaction, and only once: a run already frozen is never planned again. The rows
        in `failed` (seq: why its draft failed) are planned and failed at once, with it."""
        at = clock.now_iso()
        with self.plans.transaction():
            cursor = self.core.conn.execute(
                "UPDATE runs SET fingerprint = ?, content_fingerprint = ?, updated_at = ? "
                "WHERE run_id = ? AND fingerprint = '' AND state = 'planned'",
                (fingerprint, content_fingerprint, at, run_id),
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id}: its plan was already frozen")
            n = self.plans.insert_items(run_id, items, at)
            for seq, error in (failed or {}).items():
                # m004's trigger moves the count from pending to failed.
                self.core.conn.execute(
                    "UPDATE items SET state = 'failed', last_error = ?, updated_at = ? "
                    "WHERE run_id = ? AND seq = ? AND state = 'pending'",
                    (error, at, run_id, seq),
                )
            self.core.event(run_id, "frozen", None, {"items": n, "failed": len(failed or {})}, at)
            if then is not None:
                self.core.move_run(run_id, then, at)


class _Counts(Protocol):
    def counts(self, run_id: str) -> Counts: ...


class _Counted(Protocol):
    """What run_counts reads of the store (a Store, which this module must not import)."""

    @property
    def queries(self) -> _Counts: ...

    @property
    def drafts(self) -> Drafts: ...


def run_counts(store: _Counted, run: Run) -> Counts:
    """The run's item counts; for a --compose run still drafting (no intents yet), its
    rows: every row whose draft did not fail counts as pending, every failure as failed (so
    `status` and `runs` show its real total before its intents exist)."""
    if not (run.options.get("compose") and run.fingerprint == ""):
        return store.queries.counts(run.run_id)
    summary = store.drafts.draft_summary(run.run_id)
    return Counts.of({"pending": summary["total"] - summary["failed"], "failed": summary["failed"]})
