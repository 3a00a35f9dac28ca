"""Storing a plan: a run and every intent of it, in one transaction, after comparing its
rows with every earlier run's (history.py), so a batch sent again sends only what is new."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from notifier.domain.intent import Identities, Schedules, content_fingerprint, run_fingerprint
from notifier.domain.state_machine import RunTrigger
from notifier.store.core import Core, as_json
from notifier.store.exceptions import PlanRefused, RunExists
from notifier.store.history import ABANDONED, DELIVERED, RETRIED, Prior, RowHistory
from notifier.store.stage import _ITEM_COLUMNS, _PENDING_COLUMNS, PlanStage
from notifier.store.statements import plans as sql
from notifier.store.suppressions import Suppressions


class _NothingToSend(Exception):
    """Rolls a plan's transaction back: nothing in it is left to send."""

    def __init__(self, prior: Prior) -> None:
        super().__init__("nothing to send")
        self.prior = prior


class Planning:
    """A new run and its intents, all `pending`, stored whole or not at all."""

    def __init__(self, core: Core, history: RowHistory, suppressions: Suppressions) -> None:
        self.core = core
        self.engine = core.engine
        self.history = history
        self.suppressions = suppressions

    def create_run(
        self,
        run: dict[str, Any],
        items: Sequence[dict[str, Any]] | PlanStage,
        *,
        new_run: bool = False,
        resend_changed: bool = False,
        then: RunTrigger | None = None,
        check: Callable[[], None] | None = None,
    ) -> Prior | None:
        """The run row and every intent left to send, in one transaction: a batch is planned
        whole or not at all. `then` (e.g. `request_approval`) moves the new run in the same
        transaction, so no crash can leave a run that needs an approval looking merely
        `planned`.

        A staged plan is first compared with every earlier run (history.py), inside the
        same transaction, which plans take one at a time from its first statement (SQLite's
        BEGIN IMMEDIATE; PostgreSQL's plan lock, _serialise_plans): two `send`s of one batch
        cannot both pass the comparison before either inserts, so one plans the rows and
        the other finds them open in its run. Raises
        PlanRefused when a row is open or unsettled elsewhere, or changed (unless
        `resend_changed`); rows delivered with the same content are left out. Returns the
        comparison (None with `new_run`, which plans every row again), and stores nothing
        when nothing is left. RunExists: a run with this id is already here.

        `items` is normally the PlanStage the CSV was streamed into: its rows are copied by
        the database (`_copy_stage`), so a million intents never sit in memory at once.

        `check` runs inside the transaction once the items are stored (and suppressed), before
        the commit: what it raises rolls the whole plan back (a rehearsal that cannot fire)."""
        at = run["created_at"]
        try:
            return self._create_run(run, items, new_run, resend_changed, then, at, check)
        except _NothingToSend as nothing:
            return nothing.prior  # rolled back whole: no run stored

    def _create_run(
        self,
        run: dict[str, Any],
        items: Sequence[dict[str, Any]] | PlanStage,
        new_run: bool,
        resend_changed: bool,
        then: RunTrigger | None,
        at: str,
        check: Callable[[], None] | None = None,
    ) -> Prior | None:
        with self.transaction():
            if self.engine.execute(sql.RUN_EXISTS, {"run_id": run["run_id"]}).fetchone():
                raise RunExists(run["run_id"])
            prior = None
            if isinstance(items, PlanStage) and not new_run:
                stage = self.engine.stage_table(items)
                prior = self.history.compare(stage, items.count)
                if prior.refused(resend_changed):
                    raise PlanRefused(prior)
                if not prior.left:
                    return prior
                if prior.total != prior.left:
                    self.history.drop_delivered(stage)
                    run = {**run, **self._fingerprints(stage, run["channel_snapshot"])}
            if isinstance(items, PlanStage):
                rejected = self.history.rejected(items)
                if rejected:
                    # Rows a reviewer rejected need a review again, whatever the flags.
                    then = RunTrigger.REQUEST_APPROVAL
                    prior = Prior(items.count) if prior is None else prior
                    prior = replace(prior, rejected_by=rejected)
            self.core.insert_run(
                {
                    **run,
                    "channel_snapshot": as_json(run["channel_snapshot"]),
                    "options": as_json(run["options"]),
                    "updated_at": at,
                },
            )
            n = self.insert_items(run["run_id"], items, at)
            # After the counts: the move's trigger counts it.
            suppressed = self.suppressions.suppress_planned(run["run_id"], at)
            if suppressed == n and prior is not None and prior.count(RETRIED) == n:
                # Every row left was planned before and is suppressed now: a run of nothing
                # but suppressed items, once more each time the file is sent. None is stored.
                raise _NothingToSend(replace(prior, suppressed_only=n))
            if check is not None:
                check()
            # The fingerprint chained: verify checks the run's, and its intents', against it;
            # and the items' ids, keys and schedules, which no intent digest covers.
            detail: dict[str, Any] = {
                "items": n,
                "fingerprint": run["fingerprint"],
                **self.chained_items(run["run_id"]),
            }
            if prior is not None and prior.count(DELIVERED):
                detail["delivered_before"] = prior.count(DELIVERED)
            if prior is not None and prior.count(ABANDONED):
                detail["abandoned_before"] = prior.count(ABANDONED)
            self.core.event(run["run_id"], "planned", None, detail, at)
            if then is not None:
                self.core.move_run(run["run_id"], then, at)
        return prior

    def chained_items(self, run_id: str) -> dict[str, Any]:
        """intent.Identities and intent.Schedules of the run's items as stored (inside the
        write that stored them, for its event to chain), read in one pass."""
        identities, schedules = Identities(), Schedules()
        for item_id, key, *when in self.engine.execute(sql.ITEMS_CHAINED, {"run_id": run_id}):
            identities.add(item_id, key)
            schedules.add(*when)
        return {"identities": identities.result(), "schedules": schedules.result()}

    def _fingerprints(self, stage: str, snapshot: dict[str, Any]) -> dict[str, str]:
        """Both fingerprints of what is left in the stage: an approval covers the intents
        stored, not the rows of the file that were delivered before."""
        digests = [d for (d,) in self.engine.execute(sql.staged_digests(stage))]
        return {
            "fingerprint": run_fingerprint(digests, snapshot),
            "content_fingerprint": content_fingerprint(digests, snapshot),
        }

    def insert_items(
        self, run_id: str, items: Sequence[dict[str, Any]] | PlanStage, at: str
    ) -> int:
        """Insert the intents (all `pending`); returns how many. executemany with a fixed
        column list: sqlite-utils' insert_all inspects every value of every row."""
        rows: Iterable[tuple[Any, ...]]
        if isinstance(items, PlanStage):
            counted = self._copy_stage(run_id, items, at)
        else:
            rows = (
                (
                    item["seq"],
                    item["item_id"],
                    item["channel"],
                    item["target"],
                    as_json(item["payload"]),
                    item["idempotency_key"],
                    item["intent_digest"],
                    item.get("not_after"),
                    item.get("identity"),
                    item.get("not_before"),
                    item.get("send_window"),
                    item.get("send_tz"),
                    item.get("row_digest"),
                )
                for item in items
            )
            counted = self._insert_rows(run_id, rows, at)
        self.engine.execute(sql.COUNT_PLANNED, {"run_id": run_id, "n": counted})
        return counted

    def _insert_rows(self, run_id: str, rows: Iterable[tuple[Any, ...]], at: str) -> int:
        """`rows` (the item columns) as pending items of `run_id`; returns how many."""
        counted = 0

        def tagged() -> Iterator[tuple[Any, ...]]:
            nonlocal counted
            for row in rows:
                counted += 1
                yield (run_id, *row, at)

        self.engine.insert_pending(tagged())
        return counted

    def _copy_stage(self, run_id: str, stage: PlanStage, at: str) -> int:
        """A plan's staged intents (what is left of them) as pending items: one INSERT …
        SELECT, the database copying the rows itself."""
        copy = sql.copy_stage(self.engine.stage_table(stage), _PENDING_COLUMNS, _ITEM_COLUMNS)
        copied = self.engine.execute(copy, {"run_id": run_id, "at": at})
        self.engine.gather_statistics()
        return int(copied.rowcount)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """The write transaction that stores a plan; what copying its stage held is let go
        once the transaction has ended (SQLite cannot detach a database inside one)."""
        try:
            with self.core.write():
                self.engine.serialise_plans()
                yield
        finally:
            self.engine.release_stage()
