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

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from notifier.api import approving, planning, settling, working
from notifier.api.env import ChannelBuilder, Env, open_store, pick_run
from notifier.config import Config
from notifier.config import load as load_config
from notifier.content.batch_csv import BatchRow
from notifier.content.plan import Plan
from notifier.content.schedule import Schedule, scheduled
from notifier.content.template import Template
from notifier.domain import clock
from notifier.domain.errors import BadInput
from notifier.domain.records import Counts, Item, Run
from notifier.domain.replay import Change, Difference, Table
from notifier.domain.state_machine import FINISHED_RUN_STATES, RunState, RunTrigger
from notifier.domain.verify import RunVerdict, verify
from notifier.engine.crash import CrashPlan
from notifier.engine.run_control import RunControl
from notifier.engine.runner import RunOptions, RunResult
from notifier.engine.signals import interrupt_guard
from notifier.observe import NULL_OBSERVER, Observer
from notifier.ops import approval
from notifier.store import Store, parse_target
from notifier.store.prior import Prior

if TYPE_CHECKING:
    from notifier.content import redraft as redrafting
    from notifier.content.drafting import BatchesLeftOpen
    from notifier.domain.chain import Signer
    from notifier.store import audit_file


def _silent(line: str) -> None:
    """Say nothing: an API caller reads the results."""


@dataclass(frozen=True)
class VerifiedFile:
    """An audit file checked: how it is sealed, what its seals say, and its run's verdict."""

    path: Path
    kind: str  # the seal's ChainKind value
    key_id: str | None  # the key it is sealed with
    findings: tuple[Difference, ...]  # rows, tables or signature that do not hold
    runs: list[RunVerdict]
    given_key_id: str | None  # the key this check was given


@dataclass(frozen=True)
class Planned:
    """A stored plan: the run (None when every row of the file was already delivered or
    goes to a suppressed recipient, and nothing was stored), how the file's rows compared
    with earlier runs (None with `new_run`), and what was stored: its counts and its
    notifications per channel."""

    run: Run | None
    prior: Prior | None
    counts: Counts | None = None
    per_channel: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Composed:
    """A --compose run stored before any draft (None when no row was left to draft): how
    its rows compared with earlier runs, how many were left out as suppressed, how many wait
    for a draft."""

    run: Run | None
    prior: Prior
    suppressed: int
    to_draft: int


@dataclass(frozen=True)
class DraftFailure:
    seq: int
    line: int
    error: str


@dataclass(frozen=True)
class Drafted:
    """A --compose run once drafted and frozen, and the rows whose draft failed (never sent)."""

    run: Run
    failures: list[DraftFailure]


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

    @contextmanager
    def _store(self, *, readonly: bool = False) -> Iterator[Store]:
        """The store one call needs, closed when it returns."""
        store = open_store(self.env, readonly=readonly)
        try:
            yield store
        finally:
            store.close()

    # --- planning ------------------------------------------------------------------------

    def read(
        self,
        source: Path,
        *,
        channel: str | None = None,
        run_id: str | None = None,
        template: Template | None = None,
        not_after: datetime | None = None,
        schedule: Schedule | None = None,
        allow_duplicates: bool = False,
        rehearsal: CrashPlan | None = None,
    ) -> Plan:
        """Validate the whole file and compute every intent, streaming, into the plan's own
        scratch stage; nothing is stored (BatchError, listing every bad line, otherwise).
        `store` stores the plan, `dry_run` compares it; either closes it."""
        return planning.plan_batch(
            self.env,
            source,
            channel=channel,
            run_id=run_id,
            template=template,
            not_after=not_after,
            schedule=schedule,
            allow_duplicates=allow_duplicates,
            rehearsal=rehearsal,
        )

    def dry_run(self, plan: Plan) -> planning.DryRun:
        """How the plan's rows compare with earlier runs; nothing is written."""
        try:
            return planning.dry_run(self.env, plan)
        finally:
            plan.close()

    def store(
        self,
        plan: Plan,
        batch: Path,
        options: dict[str, object],
        *,
        new_run: bool = False,
        resend_changed: bool = False,
        rehearsal: CrashPlan | None = None,
    ) -> Planned:
        """Store what is left of the plan, in one transaction, as run `plan.run_id` of
        `batch` with `options` (planning.stored_options). A run that needs approval (asked for in
        `options`, the configuration's policy, or rows a reviewer rejected) is stored awaiting
        it; one sent now first has its channels checked (their secrets and URLs from the
        environment): BadInput means nothing was stored."""
        if self.env.config.approval_required(plan.per_channel):
            options["require_approval"] = True  # the policy, kept with the run
        then = RunTrigger.REQUEST_APPROVAL if options.get("require_approval") else None
        if then is None:
            try:
                planning.check_channels(self.env, plan.per_channel)
            except BaseException:
                plan.close()
                raise
        stored = planning.store_plan(
            self.env,
            plan,
            batch,
            options,
            new_run,
            resend_changed=resend_changed,
            then=then,
            rehearsal=rehearsal,
        )
        if stored.store is None:
            return Planned(None, stored.prior)
        store = stored.store
        try:
            run = store.core.get_run(plan.run_id)
            left_out = stored.prior is not None and stored.prior.left < plan.count
            per_channel = store.queries.per_channel(run.run_id) if left_out else plan.per_channel
            return Planned(run, stored.prior, store.queries.counts(run.run_id), per_channel)
        finally:
            store.close()

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
        """`read` the file, then `store` it; nothing is sent."""
        plan = self.read(
            batch,
            channel=channel,
            run_id=run_id,
            template=template,
            not_after=not_after,
            schedule=schedule,
            allow_duplicates=allow_duplicates,
        )
        options = planning.stored_options(
            {"concurrency": concurrency, "max_wait": max_wait, "rate": rate},
            channel=channel,
            allow_duplicates=allow_duplicates or None,
            require_approval=require_approval or None,
        )
        return self.store(plan, batch, options, new_run=new_run, resend_changed=resend_changed)

    # --- composing (send --compose) ------------------------------------------------------

    def compose_rows(
        self,
        source: Path,
        batch: Path,
        *,
        channel: str | None,
        run_id: str | None,
        not_after: datetime | None,
        schedule: Schedule,
        allow_duplicates: bool = False,
    ) -> list[BatchRow]:
        """The rows of a file to compose, validated whole and scheduled as a plain send
        schedules them (the model never sees their `tz` and `not_before`); nothing stored."""
        rows = planning.read_rows(
            self.env,
            source,
            channel=channel,
            run_id=run_id,
            not_after=not_after,
            allow_duplicates=allow_duplicates,
        )
        return scheduled(rows, schedule, batch)

    def store_composed(
        self, rows: list[BatchRow], batch: Path, options: dict[str, object], run_id: str
    ) -> Composed:
        """Store the run and one pending draft per row left to draft, before a token is spent:
        rows delivered before, or whose recipient is suppressed, are left out; a row open
        elsewhere refuses the file (BadInput). Approval as `store` decides it."""
        if self.env.config.approval_required({row.channel for row in rows}):
            options["require_approval"] = True  # the policy, kept with the run
        compared = planning.compare_composed(self.env, rows, batch, run_id)
        if compared.prior.rejected_by:
            options["require_approval"] = True  # rows a reviewer rejected: reviewed again
        if not compared.rows:
            return Composed(None, compared.prior, compared.suppressed, 0)
        if "require_approval" not in options:
            planning.check_channels(self.env, {row.channel for row in compared.rows})
        store = planning.store_drafting_run(self.env, compared.rows, batch, options, run_id)
        try:
            run = store.core.get_run(run_id)
        finally:
            store.close()
        return Composed(run, compared.prior, compared.suppressed, len(compared.rows))

    def draft(self, run_id: str) -> Drafted:
        """Draft what a --compose run lacks, then freeze its intents (awaiting approval when
        it needs one); NeedsAttention when drafting cannot finish now, the drafts made
        stored. KeyboardInterrupt leaves with the answers received stored."""
        with self._store() as store:
            run = working.draft_run(self.env, store, store.core.get_run(run_id))
            failures = [
                DraftFailure(seq, line, error)
                for seq, line, error in store.drafts.draft_failures(run.run_id)
            ]
            return Drafted(run, failures)

    def redraft_with(self, run: Run, model: str | None, recreate: bool) -> Run:
        """For a run still drafting: `model` for the rows not drafted yet, and/or `recreate`
        the batch chunks whose creation is in doubt (paid again); BadInput otherwise."""
        from notifier.content import drafting  # noqa: PLC0415 (the Claude SDK loads with it)

        with self._store() as store:
            return drafting.resume_overrides(store, run, model, recreate, self.env.say)

    def cancel_open_batches(self, run_id: str) -> BatchesLeftOpen:
        """After the cancel of a run that drafted through Message Batches: cancel (and
        record) any batch still open, as one left by a drafting process that was
        interrupted or killed. Returns those that stay open (the API could not be asked)."""
        from notifier.content import drafting  # noqa: PLC0415 (the Claude SDK loads with it)

        with self._store() as store:
            return drafting.cancel_batches(store, run_id, self.env.say)

    def redraft(self, run_id: str | None, item_ids: Sequence[str]) -> redrafting.Result:
        """New drafts for rows `item_ids` of a --compose run awaiting approval (without
        `run_id` the newest run): the run and rows checked first (RedraftUsage), its lease
        held while they are drafted, so no resume or second redraft runs meanwhile.
        LostRace if another command approved, rejected or redrafted it first."""
        from notifier.content import drafting  # noqa: PLC0415 (the Claude SDK loads with it)
        from notifier.content import redraft as redrafting  # noqa: PLC0415
        from notifier.domain import who  # noqa: PLC0415

        with self._store() as store:
            run = pick_run(store, run_id)
            redrafting.check_run(run)
            # Exit 2 for an unknown row before the key or the lease is looked at.
            redrafting.pick_rows(store, run, item_ids)
            key = drafting.compose_key()
            interrupted = RunControl()
            with (
                working.take_lease(store, run, self.env.config.lease_ttl_s),
                interrupt_guard(interrupted, self.env.say),
            ):
                return redrafting.redraft(
                    store,
                    store.core.get_run(run.run_id),
                    item_ids,
                    key,
                    self.env.config,
                    who.operator_name(),
                    self.env.say,
                    interrupted,
                )

    def approval_preview(self, run: Run) -> approval.Glimpse:
        """The first notifications of a run awaiting approval, as its review starts."""
        with self._store(readonly=True) as store:
            return approval.preview(store, run)

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
        with self._store() as store:
            run = pick_run(store, run_id, active_only=not joining or run_id is None)
            if run.state not in FINISHED_RUN_STATES:  # finished: the runner says so, sends nothing
                approval.check_can_send(store, run)  # before the lease: a refusal changes nothing
            counts = store.queries.counts(run.run_id)
            options = run_options(run, concurrency, max_wait, rate, restart=not joining)

            def held() -> None:
                stale = store.ledger.past_deadline(run.run_id, clock.now_iso())
                announce(Resuming(run, counts, stale))

            return working.work_run(
                self.env, store, run, options, advance=advance, announce=held, observer=observer
            )

    def approve(
        self, run_id: str | None, fingerprint: str, *, expires_in: str = "24h"
    ) -> tuple[Run, approval.Approval]:
        """Approve the run whose notifications hash to `fingerprint` (what `preview` showed),
        until `expires_in`; without `run_id`, the run awaiting approval with that fingerprint."""
        return approving.approve(self.env, run_id, fingerprint, expires_in)

    def reject(self, run_id: str | None, reason: str) -> tuple[Run, str]:
        """Close a run awaiting approval, with the reason and the operator audited."""
        return approving.reject(self.env, run_id, reason)

    def cancel(self, run_id: str | None = None, *, wait_s: float = 15.0) -> settling.CancelResult:
        """Stop the run: once this returns confirmed, no request of it can start any more."""
        return settling.cancel(self.env, run_id, wait_s)

    def reconcile(self, run_id: str | None = None) -> settling.Reconciled:
        """Settle in-flight and unknown items by asking their downstream, by key; with the
        unknown items left on channels that cannot be asked."""
        return settling.reconcile_by_query(self.env, run_id)

    # --- reading -------------------------------------------------------------------------

    def run(self, run_id: str | None = None, *, active_only: bool = False) -> Run:
        """Run `run_id`, or the newest (with `active_only`, the newest not completed or
        cancelled); BadInput naming `notifier runs` when there is none."""
        with self._store(readonly=True) as store:
            return pick_run(store, run_id, active_only=active_only)

    def counts(self, run_id: str) -> Counts:
        with self._store(readonly=True) as store:
            return store.queries.counts(run_id)

    def item(self, run_id: str, seq: int) -> Item | None:
        """Item `seq` of run `run_id`; None when the run has no such item."""
        with self._store(readonly=True) as store:
            try:
                return store.queries.item(run_id, seq)
            except KeyError:
                return None

    def items(self, run_id: str) -> list[Item]:
        with self._store(readonly=True) as store:
            return list(store.queries.items(run_id))

    # --- evidence ------------------------------------------------------------------------

    def export(
        self, run_id: str | None, to: Path, *, with_bodies: bool = False
    ) -> audit_file.Exported:
        """Write run `run_id` (default: the newest) to a new audit file at `to`, sealed with
        the audit key when one is set; read in one snapshot, so it may run beside a send."""
        from notifier.store import audit_file  # noqa: PLC0415 (sqlite-utils loads only here)

        signer = self.env.config.signer()
        with self._store(readonly=True) as store:
            run = pick_run(store, run_id)
            try:
                return audit_file.export(
                    store.core, run.run_id, to, signer, with_bodies=with_bodies
                )
            except FileExistsError:
                raise BadInput(
                    f"{to} already exists: an export never writes over a file. Give --to "
                    "another path, or move that file away first."
                ) from None

    def verify_export(self, path: Path) -> VerifiedFile:
        """Check an audit file offline: each row's seal and the manifest's signature, then
        its run's chain and replay, as for a run in the database."""
        from notifier.store import audit_file  # noqa: PLC0415 (sqlite-utils loads only here)

        signer = self.env.config.signer()

        def damaged(exc: audit_file.Damaged) -> VerifiedFile:
            if audit_file.unreadable_now(exc):  # locked by another process: not its bytes
                raise BadInput(
                    f"{path} cannot be read now ({exc}): another process holds it. Verify it "
                    "again once that process is done; nothing was judged."
                ) from None
            # An SQLite file SQLite finds damaged (a page overwritten, a copy cut short):
            # not the file the export wrote, so altered, as any other change to it.
            finding = Difference(Table.SEAL, "the file", Change.DIFFERS, "damaged", str(exc))
            return VerifiedFile(path, "unknown", None, (finding,), [], signer.key_id)

        try:
            exported = audit_file.AuditFile(path)
        except audit_file.Damaged as exc:
            return damaged(exc)
        except (ValueError, OSError) as exc:
            raise BadInput(
                f"{path} cannot be read as a notifier audit file ({exc}). Give the file an "
                "export wrote, or a run id."
            ) from None
        try:
            return self._verify_opened(exported, path, signer)
        except audit_file.Damaged as exc:
            return damaged(exc)
        finally:
            exported.close()

    def _verify_opened(
        self, exported: audit_file.AuditFile, path: Path, signer: Signer
    ) -> VerifiedFile:
        """The seals, manifest and signature of the opened file, then its run's chain and
        replay."""
        from notifier.store import audit_file  # noqa: PLC0415 (sqlite-utils loads only here)

        large = exported.item_count() > audit_file.APART_ABOVE_ITEMS
        with audit_file.second_process(large) as pool:
            # The seals, manifest and signature, checked beside the replay for a large
            # file (check_file opens the file for the process that runs it).
            sealed = audit_file.handed(pool, audit_file.check_file, path, signer)
            replayed: list[Difference] = []
            try:
                runs = verify(exported, exported.run_ids(), signer)
            except (ValueError, TypeError) as exc:
                # A row whose values are not of their column's kind (an item_seq of
                # text): written by no export, so the file was altered.
                runs = []
                replayed.append(Difference(Table.SEAL, "the file", Change.DIFFERS, "rows",
                                           str(exc), None))  # fmt: skip
            findings = sealed() + replayed
        kind, key_id = exported.meta.get("kind"), exported.meta.get("key_id")
        return VerifiedFile(path, str(kind), key_id, tuple(findings), runs, signer.key_id)


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
