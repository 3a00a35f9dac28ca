"""Claude drafts (--compose): stored one by one before any digest, then frozen into
intents exactly once."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from notifier.domain import clock
from notifier.domain.errors import Refused
from notifier.domain.intent import DraftingInputs, draft_digest
from notifier.domain.records import Counts, EventKind, Run, StoredDraft
from notifier.domain.state_machine import RunTrigger
from notifier.store.core import Core, as_json
from notifier.store.exceptions import LostRace
from notifier.store.plans import Planning
from notifier.store.stage import PlanStage
from notifier.store.statements import drafts as sql


class Drafts:
    """The drafts of a --compose run, and the one freeze of its plan."""

    def __init__(self, core: Core, plans: Planning) -> None:
        self.core = core
        self.engine = core.engine
        self.plans = plans

    def create_drafting_run(
        self, run: dict[str, Any], sources: Sequence[tuple[int, int, str, str]]
    ) -> None:
        """The run row (fingerprint empty: not frozen yet) and one pending draft per row
        (seq, line, source, the source row's digest: plan.source_digest), in one
        transaction."""
        at = run["created_at"]
        with self.core.write():
            self.core.insert_run(
                {
                    **run,
                    "fingerprint": "",
                    "channel_snapshot": as_json(run["channel_snapshot"]),
                    "options": as_json(run["options"]),
                    "updated_at": at,
                },
            )
            self.engine.execute_many(
                sql.INSERT_DRAFT,
                (
                    {
                        "run_id": run["run_id"],
                        "seq": seq,
                        "line": line,
                        "source": source,
                        "digest": digest,
                    }
                    for seq, line, source, digest in sources
                ),
            )
            # What the intents will be made of besides the drafts, chained: verify, and the
            # freeze before it makes intents of them, find one rewritten while the run drafts.
            inputs = DraftingInputs()
            for _, _, source, _ in sources:
                inputs.add(source)
            # Hashed as they are read back (JSON), as verify and the freeze will hash them.
            options = json.loads(as_json(run["options"]) or "null")
            snapshot = json.loads(as_json(run["channel_snapshot"]) or "null")
            made_of = inputs.result(options, snapshot, run.get("key_nonce"))
            detail = {"drafts": len(sources), "inputs": made_of}
            self.core.event(run["run_id"], "planned", None, detail, at)

    def pending_drafts(self, run_id: str) -> list[tuple[int, str]]:
        return [
            (seq, source)
            for seq, source in self.engine.execute(sql.PENDING_DRAFTS, {"run_id": run_id})
        ]

    def save_draft(self, run_id: str, seq: int, draft: dict[str, Any]) -> None:
        """A draft, durable before any digest is computed from it; only ever once per row."""
        at = clock.now_iso()
        with self.core.write():
            cursor = self.engine.execute(
                sql.SAVE_DRAFT,
                {
                    "subject": draft["subject"],
                    "body": draft["body"],
                    "model": draft["model"],
                    "input_tokens": draft["input_tokens"],
                    "output_tokens": draft["output_tokens"],
                    "at": at,
                    "run_id": run_id,
                    "seq": seq,
                },
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} row {seq}: already drafted")
            chained = {"model": draft["model"],
                       "draft": draft_digest(draft["subject"], draft["body"])}  # fmt: skip
            self.core.event(run_id, EventKind.DRAFTED, seq, chained, at)

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
            key = {"run_id": run_id, "seq": seq, "expected": expected}
            if usage is not None:
                model, input_tokens, output_tokens = usage
                self.engine.execute(
                    sql.DRAFT_USAGE,
                    {"model": model, "input_tokens": input_tokens,
                     "output_tokens": output_tokens, **key},
                )  # fmt: skip
            cursor = self.engine.execute(sql.FAIL_DRAFT, {"error": error, "at": at, **key})
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
            row = self.engine.execute(sql.DRAFTING_RUN_OPTIONS, {"run_id": run_id}).fetchone()
            if row is None:
                raise LostRace(f"run {run_id}: its drafts are already frozen")
            options = json.loads(row.options)
            before = str(options["compose"]["model"])
            options["compose"]["model"] = model
            self.engine.execute(
                sql.SET_RUN_OPTIONS, {"options": as_json(options), "at": at, "run_id": run_id}
            )
            (pending,) = self.engine.execute(sql.PENDING_DRAFT_COUNT, {"run_id": run_id}).fetchone()
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
        the row's slot, and nothing was sent under it. Tokens add up: both drafts were paid.
        Refused, nothing written, if another run delivered, abandoned or holds one of the
        rows (`refuse_held_elsewhere`), read under the lock plans take: a row failed here
        may have been sent by the same file sent again since."""
        at = clock.now_iso()
        with self.plans.transaction():
            self.refuse_held_elsewhere(run_id, [seq for seq, *_ in rows])
            cursor = self.engine.execute(
                sql.REDRAFT_RUN,
                {
                    "fingerprint": fingerprint,
                    "content_fingerprint": content_fingerprint,
                    "at": at,
                    "run_id": run_id,
                    "before": before,
                },
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id} changed while it was being redrafted")
            for seq, draft, payload, digest, identity in rows:
                key = {"at": at, "run_id": run_id, "seq": seq}
                self.engine.execute(
                    sql.REDRAFT,
                    {"subject": draft["subject"], "body": draft["body"], "model": draft["model"],
                     "input_tokens": draft["input_tokens"],
                     "output_tokens": draft["output_tokens"], **key},
                )  # fmt: skip
                # A row whose first draft failed is planned again (m004's trigger moves
                # its count); one ever attempted is not touched (LostRace).
                moved = self.engine.execute(
                    sql.REDRAFT_ITEM,
                    {"payload": payload, "digest": digest, "identity": identity, **key},
                )
                if moved.rowcount != 1:
                    raise LostRace(f"run {run_id} row {seq}: its intent was already used")
                chained = {"model": draft["model"], "intent_digest": digest,
                           "draft": draft_digest(draft["subject"], draft["body"])}  # fmt: skip
                self.core.event(run_id, EventKind.REDRAFTED, seq, chained, at)
            self.core.event(
                run_id,
                "redraft",
                None,
                {"operator": operator, "rows": [seq for seq, *_ in rows],
                 "fingerprint_before": before, "fingerprint": fingerprint},
                at,
            )  # fmt: skip

    def refuse_held_elsewhere(self, run_id: str, seqs: Sequence[int]) -> None:
        """Refused (exit 4) if another run delivered, abandoned or holds one of run
        `run_id`'s rows `seqs` (row identity): planned again here, it would be sent twice."""
        held = self.plans.history.held_by_other_runs(run_id, seqs)
        if held:
            listed = ", ".join(f"{item_id} (run {run})" for item_id, run in held.items())
            raise Refused(
                f"run {run_id}: another run sent or holds row(s) {listed}, so a new draft would "
                "send them a second time. Refused: nothing was redrafted, and those rows stay "
                "failed in this run."
            )

    def drafts(self, run_id: str) -> list[StoredDraft]:
        return [StoredDraft(*tuple(r)) for r in self.engine.execute(sql.DRAFTS, {"run_id": run_id})]

    def draft_summary(self, run_id: str) -> dict[str, int]:
        summary = {"total": 0, "drafted": 0, "failed": 0, "pending": 0}
        for state, n in self.engine.execute(sql.DRAFT_STATES, {"run_id": run_id}):
            summary[state] = n
            summary["total"] += n
        tokens = self.engine.execute(sql.DRAFT_TOKENS, {"run_id": run_id}).fetchone()
        summary["input_tokens"] = int(tokens.input_tokens)
        summary["output_tokens"] = int(tokens.output_tokens)
        return summary

    def draft_failures(self, run_id: str) -> list[tuple[int, int, str]]:
        """(seq, line, error) of every row whose draft failed."""
        return [
            (seq, line, error)
            for seq, line, error in self.engine.execute(sql.DRAFT_FAILURES, {"run_id": run_id})
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
        in `failed` (seq: why its draft failed) are planned and failed at once, with it, and
        so is every row another run delivered, abandoned or holds open meanwhile (compared
        by row identity in this transaction, which plans take one at a time): drafting may
        take hours, and a plain send of the same file in between must not make it twice."""
        at = clock.now_iso()
        failed = dict(failed or {})
        with self.plans.transaction():
            if isinstance(items, PlanStage):
                for seq, run in self.plans.history.held_elsewhere(items, run_id).items():
                    failed.setdefault(
                        seq, f"not sent: run {run} delivered this row, or holds it, meanwhile"
                    )
                if then is None and self.plans.history.rejected(items):
                    # A reviewer rejected another run of these rows while this one drafted:
                    # they need a review again, as a plain send of them would.
                    then = RunTrigger.REQUEST_APPROVAL
            cursor = self.engine.execute(
                sql.FREEZE_RUN,
                {
                    "fingerprint": fingerprint,
                    "content_fingerprint": content_fingerprint,
                    "at": at,
                    "run_id": run_id,
                },
            )
            if cursor.rowcount != 1:
                raise LostRace(f"run {run_id}: its plan was already frozen")
            n = self.plans.insert_items(run_id, items, at)
            self.plans.suppressions.suppress_planned(run_id, at)  # after the counts
            failed_now = 0
            for seq, error in failed.items():
                # m004's trigger moves the count from pending to failed. A row suppressed
                # just above stays suppressed (never sent either): only a move made has its
                # event, so the chain replays to the rows as stored.
                cursor = self.engine.execute(
                    sql.FAIL_FROZEN_ITEM, {"error": error, "at": at, "run_id": run_id, "seq": seq}
                )
                if cursor.rowcount == 1:
                    moved = {"from": "pending", "to": "failed", "set": {"last_error": error}}
                    self.core.event(run_id, EventKind.FAILED_AT_FREEZE, seq, moved, at)
                    failed_now += 1
            frozen = {"items": n, "failed": failed_now, "fingerprint": fingerprint,
                      **self.plans.chained_items(run_id)}  # fmt: skip
            self.core.event(run_id, "frozen", None, frozen, at)
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
