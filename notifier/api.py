"""The in-process API: what the command line does, for Python callers and the tests, with
typed results and nothing printed.

    notifier = Notifier.open("receipts.db")
    result = notifier.send(Path("batch.csv"), concurrency=8)
    result.state, result.counts.sent

`channels=` swaps every downstream for an in-process one (channels/scripted.py), the way
httpx's MockTransport swaps the network, so the whole engine runs on either store with no
socket: `Notifier.open(db, channels=Channels(hooks=ScriptedChannel("hooks", script)))`.

The commands call the same `app` functions this does and add only what a terminal needs:
options, progress, advice. What a method refuses it raises as the error model's exceptions
(errors.py), each of which the command line maps to its exit code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from . import app, approval, clock
from .config import Config
from .config import load as load_config
from .env import ChannelBuilder, Env, open_store, pick_run
from .errors import BadInput
from .observe import NULL_OBSERVER, Observer
from .records import Counts, Item, Run
from .runner import RunOptions, RunResult
from .schedule import Schedule
from .state_machine import FINISHED_RUN_STATES, RunState, RunTrigger
from .store import parse_target
from .store.prior import Prior
from .template import Template


def _silent(line: str) -> None:
    """Say nothing: an API caller reads the results."""


@dataclass(frozen=True)
class Planned:
    """A stored plan: the run (None when every row of the file was already delivered or
    goes to a suppressed recipient, and nothing was stored) and how the file's rows compared
    with earlier runs (None with `new_run`)."""

    run: Run | None
    prior: Prior | None


@dataclass(frozen=True)
class Resuming:
    """What a run holds as its lease is taken, before anything is settled or sent."""

    run: Run
    counts: Counts
    past_deadline: int  # pending items already past their not_after: expired, never sent


@dataclass(frozen=True)
class Notifier:
    """One database and one configuration; each call opens the store it needs and closes it.
    A command builds one from its environment (`Notifier(env)`); Python callers and tests
    from a database (`Notifier.open(db)`)."""

    env: Env

    @classmethod
    def open(
        cls,
        db: str | Path,
        *,
        config: Config | Path | None = None,
        channels: ChannelBuilder | None = None,
        say: Callable[[str], None] = _silent,
    ) -> Notifier:
        if not isinstance(config, Config):
            config = load_config(config or Path("notifier.toml"), explicit=config is not None)
        target = parse_target(db)
        if channels is None:
            return cls(Env(target, config, say))
        return cls(Env(target, config, say, channels))

    # --- planning ------------------------------------------------------------------------

    def plan(
        self,
        batch: Path,
        *,
        channel: str | None = None,
        run_id: str | None = None,
        concurrency: int = 1,
        max_wait: float = 600.0,
        rate: float | None = None,
        template: Template | None = None,
        not_after: datetime | None = None,
        schedule: Schedule | None = None,
        require_approval: bool = False,
        allow_duplicates: bool = False,
        new_run: bool = False,
        resend_changed: bool = False,
    ) -> Planned:
        """Validate the whole file and store every intent in one transaction; nothing is sent.
        A run that needs approval (asked for, the configuration's policy, or rows a reviewer
        rejected) is stored awaiting it."""
        plan = app.plan_batch(
            self.env,
            batch,
            channel=channel,
            run_id=run_id,
            template=template,
            not_after=not_after,
            schedule=schedule,
            allow_duplicates=allow_duplicates,
        )
        options = app.stored_options(
            {"concurrency": concurrency, "max_wait": max_wait, "rate": rate},
            channel=channel,
            allow_duplicates=allow_duplicates or None,
            require_approval=require_approval or None,
        )
        if self.env.config.approval_required(plan.per_channel):
            options["require_approval"] = True
        then = RunTrigger.REQUEST_APPROVAL if options.get("require_approval") else None
        if then is None:
            try:
                app.check_channels(self.env, plan.per_channel)
            except BaseException:
                plan.close()
                raise
        stored = app.store_plan(
            self.env, plan, batch, options, new_run, resend_changed=resend_changed, then=then
        )
        if stored.store is None:
            return Planned(None, stored.prior)
        try:
            return Planned(stored.store.core.get_run(plan.run_id), stored.prior)
        finally:
            stored.store.close()

    def send(self, batch: Path, **options: Any) -> RunResult | Planned:
        """Plan the file, then send it: the run's result, or the plan when nothing was left to
        send or the run awaits approval."""
        planned = self.plan(batch, **options)
        if planned.run is None or planned.run.state is RunState.AWAITING_APPROVAL:
            return planned
        return self.work(planned.run.run_id)

    # --- working a stored run ------------------------------------------------------------

    def work(
        self,
        run_id: str | None = None,
        *,
        concurrency: int | None = None,
        max_wait: float | None = None,
        rate: float | None = None,
        joining: bool = False,
        advance: Callable[[int], None] = lambda n: None,
        announce: Callable[[Resuming], None] = lambda resuming: None,
        observer: Observer = NULL_OBSERVER,
    ) -> RunResult:
        """Settle every in-flight item by asking its downstream, then send the rest in order,
        with the run's own pace unless overridden; with `joining`, as one more worker of a
        run shared through PostgreSQL. `announce` runs once the lease is held."""
        store = open_store(self.env)
        try:
            run = pick_run(store, run_id, active_only=not joining or run_id is None)
            if run.state in FINISHED_RUN_STATES:
                raise BadInput(f"run {run.run_id} is {run.state.value}; there is nothing to do.")
            approval.check_can_send(store, run)  # before the lease: a refusal changes nothing
            counts = store.queries.counts(run.run_id)
            options = run_options(run, concurrency, max_wait, rate, restart=not joining)

            def held() -> None:
                stale = store.ledger.past_deadline(run.run_id, clock.now_iso())
                announce(Resuming(run, counts, stale))

            return app.work_run(
                self.env, store, run, options, advance=advance, announce=held, observer=observer
            )
        finally:
            store.close()

    def approve(
        self, run_id: str | None, fingerprint: str, *, expires_in: str = "24h"
    ) -> tuple[Run, approval.Approval]:
        """Approve the run whose notifications hash to `fingerprint` (what `preview` showed),
        until `expires_in`; without `run_id`, the run awaiting approval with that fingerprint."""
        return app.approve(self.env, run_id, fingerprint, expires_in)

    def reject(self, run_id: str | None, reason: str) -> tuple[Run, str]:
        """Close a run awaiting approval, with the reason and the operator audited."""
        return app.reject(self.env, run_id, reason)

    def cancel(self, run_id: str | None = None, *, wait_s: float = 15.0) -> app.CancelResult:
        """Stop the run: once this returns confirmed, no request of it can start any more."""
        return app.cancel(self.env, run_id, wait_s)

    def reconcile(self, run_id: str | None = None) -> tuple[Run, Counts]:
        """Settle in-flight and unknown items by asking their downstream, by key."""
        return app.reconcile_by_query(self.env, run_id)

    # --- reading -------------------------------------------------------------------------

    def run(self, run_id: str | None = None) -> Run:
        store = open_store(self.env, readonly=True)
        try:
            return pick_run(store, run_id)
        finally:
            store.close()

    def counts(self, run_id: str) -> Counts:
        store = open_store(self.env, readonly=True)
        try:
            return store.queries.counts(run_id)
        finally:
            store.close()

    def items(self, run_id: str) -> list[Item]:
        store = open_store(self.env, readonly=True)
        try:
            return list(store.queries.items(run_id))
        finally:
            store.close()


def run_options(
    run: Run,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
    *,
    restart: bool,
) -> RunOptions:
    """How to work `run`: what the caller overrides, else the pace stored with the run."""
    stored = run.options
    stored_rate = stored.get("rate")
    return RunOptions(
        concurrency or int(stored.get("concurrency", 1)),
        max_wait if max_wait is not None else float(stored.get("max_wait", 600)),
        rate=rate or (float(stored_rate) if stored_rate else None),
        restart=restart,
    )
