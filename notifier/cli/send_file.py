"""`send` of a file, on the command line: what the command prints while the API (notifier/api)
reads, compares, stores and sends it, and what it says when a dry run, a refusal or a
Ctrl-C stops it first. The compose path is send_composed.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from notifier.cli import running
from notifier.cli.group import echo, warn
from notifier.domain.errors import Interrupted
from notifier.domain.records import notifications
from notifier.domain.state_machine import RunState

if TYPE_CHECKING:
    from notifier.api import Notifier, Planned
    from notifier.content.plan import Plan
    from notifier.content.schedule import Schedule
    from notifier.content.template import Template
    from notifier.domain.records import Run
    from notifier.engine.crash import CrashPlan
    from notifier.observe import Observer


@dataclass(frozen=True)
class SendOptions:
    """The options of one `notifier send`, as click parsed them."""

    channel: str | None
    run_id: str | None
    concurrency: int
    dry_run: bool
    new_run: bool
    resend_changed: bool
    allow_expired: bool
    allow_duplicates: bool
    max_wait: float
    template_path: Path | None
    require_approval: bool
    not_after_text: str | None
    compose_path: Path | None
    model: str
    batch_api: bool
    compose_columns: str | None
    rate: float | None
    not_before_text: str | None
    tz: str | None
    window: str | None
    metrics_port: int | None
    log_format: str
    log_bodies: bool

    def stored(self) -> dict[str, object]:
        """What is kept with the run (planning.stored_options): its pace, and what shaped it,
        which every command the tool suggests repeats."""
        from notifier.api import planning  # noqa: PLC0415 (start-up time)

        return planning.stored_options(
            {"concurrency": self.concurrency, "max_wait": self.max_wait, "rate": self.rate},
            channel=self.channel,
            template_path=self.template_path and str(self.template_path),
            compose_path=self.compose_path and str(self.compose_path),
            not_after=self.not_after_text,
            not_before=self.not_before_text,
            tz=self.tz,
            window=self.window,
            allow_duplicates=self.allow_duplicates or None,
            require_approval=self.require_approval or None,
        )


@dataclass(frozen=True)
class Sending:
    """What every path of `send` works with once the options are read."""

    ctx: click.Context
    notifier: Notifier
    source: Path  # what is read (a spool for rows piped in)
    batch: Path  # what the run, the messages and the advice name (`-` for rows piped in)
    given: SendOptions
    options: dict[str, object]  # kept with the run
    template: Template | None
    not_after: datetime | None
    when: Schedule
    observer: Observer

    @property
    def quiet(self) -> bool:
        return self.given.log_format == "json"  # stderr carries JSON lines: no progress bar

    def again(self) -> str:
        from notifier.cli.outcome import send_again  # noqa: PLC0415 (start-up time)

        return send_again(str(self.batch), self.options)

    def send_stored(
        self, run_id: str, total: int, per_channel: Mapping[str, int], draft_failures: int = 0
    ) -> None:
        """Send the stored run with the command's pace, a progress bar over its `total`
        notifications, then say how it ended and exit with the contract's code."""
        self.observer.planned(run_id, total, dict(per_channel))
        with running.progress(total, quiet=self.quiet) as advance:
            result = self.notifier.work(
                run_id,
                concurrency=self.given.concurrency,
                max_wait=self.given.max_wait,
                rate=self.given.rate,
                advance=advance,
                observer=self.observer,
            )
        running.finish(self.ctx, run_id, result, draft_failures, again=self.again())

    def interrupted_planning(self) -> Interrupted:
        return Interrupted(
            f"interrupted (Ctrl-C) while reading and planning {self.batch}: nothing was stored "
            f"and nothing was sent. Run `{self.again()}` again to plan and send it."
        )


def send_file(sending: Sending, rehearsal: CrashPlan | None) -> None:
    """Read the whole file, store what is left of it, then send (or wait for approval)."""
    from notifier.content.schedule import late_warning  # noqa: PLC0415 (start-up time)

    notifier, given, batch = sending.notifier, sending.given, sending.batch
    try:
        with running.naming_stdin(sending.source, batch):
            plan = notifier.read(
                sending.source,
                channel=given.channel,
                run_id=given.run_id,
                template=sending.template,
                not_after=sending.not_after,
                schedule=sending.when,
                allow_duplicates=given.allow_duplicates,
                rehearsal=rehearsal,
            )
    except KeyboardInterrupt:
        raise sending.interrupted_planning() from None
    if (late := late_warning(sending.when)) is not None:
        warn(late)
    if given.dry_run:
        _dry_run(sending, plan)
        return
    try:
        planned = notifier.store(
            plan,
            batch,
            sending.options,
            new_run=given.new_run,
            resend_changed=given.resend_changed,
            rehearsal=rehearsal,
        )
    except KeyboardInterrupt:
        raise _interrupted_storing(sending, plan.run_id) from None
    run = _announce(sending, planned)
    if run is None:
        return
    if run.state is RunState.AWAITING_APPROVAL:
        running.await_approval(notifier, run)
        return
    total = planned.counts.total if planned.counts else 0
    sending.send_stored(run.run_id, total, planned.per_channel)


def _announce(sending: Sending, planned: Planned) -> Run | None:
    """Say how the file compared with earlier runs and what was planned; the run, or None
    when nothing was left to send."""
    from notifier.cli.earlier import prior_summary  # noqa: PLC0415 (start-up time)

    for line in prior_summary(planned.prior) if planned.prior else []:
        echo(line)
    run, counts = planned.run, planned.counts
    if run is None or counts is None:
        from notifier.store.history import ABANDONED  # noqa: PLC0415 (start-up time)

        suppressed = planned.prior.suppressed_only if planned.prior is not None else 0
        # An abandoned row is maybe delivered: nobody knows, so it is never called delivered.
        abandoned = planned.prior is not None and planned.prior.count(ABANDONED) > 0
        left_out = (
            "is left out: each was delivered before, or abandoned by an operator (maybe "
            "delivered), with the same content"
            if abandoned
            else "was already delivered with the same content"
        )
        echo(
            f"nothing to send: the {suppressed} row(s) of {sending.batch} left to send all go "
            "to suppressed recipients (`notifier suppress list`); no run was stored."
            if suppressed
            else f"nothing to send: every row of {sending.batch} {left_out}. `notifier runs` "
            "lists the runs; --new-run sends every row again."
        )
        return None
    per_channel = ", ".join(f"{name}: {n}" for name, n in sorted(planned.per_channel.items()))
    echo(f"planned run {run.run_id}: {notifications(counts.total)} ({per_channel})")
    if counts.suppressed:
        echo(
            f"{counts.suppressed} of them suppressed (their recipient is on the suppression "
            "list): stored, never sent. `notifier suppress list` shows the list."
        )
    echo(f"fingerprint: {run.fingerprint}")
    return run


def _dry_run(sending: Sending, plan: Plan) -> None:
    """What `send` would plan, and why; nothing is written."""
    from notifier.api import planning  # noqa: PLC0415 (start-up time)
    from notifier.cli.earlier import prior_summary  # noqa: PLC0415
    from notifier.cli.outcome import error_message  # noqa: PLC0415

    per_channel = ", ".join(f"{name}: {n}" for name, n in sorted(plan.per_channel.items()))
    count, fingerprint = plan.count, plan.fingerprint
    dry = sending.notifier.dry_run(plan)
    prior = dry.prior
    echo(f"dry run: {notifications(count)} ({per_channel}); nothing written.")
    echo(f"fingerprint: {fingerprint}")
    if sending.given.new_run:
        echo("--new-run: every row would be planned again.")
    elif prior.refused(sending.given.resend_changed):
        refused = error_message(planning.refusal(sending.batch, prior, dry.open_run))
        echo(f"send would refuse it: {refused}")
    else:
        for line in prior_summary(prior):
            echo(line)
        echo(f"send would plan {prior.left} of them.")


def _interrupted_storing(sending: Sending, run_id: str) -> Interrupted:
    """Ctrl-C while the plan was being stored: its one transaction either committed or rolled
    back; the database says which."""
    from notifier.api import planning  # noqa: PLC0415 (start-up time)

    stored = planning.run_stored(sending.notifier.env, run_id)
    if stored is False:
        return sending.interrupted_planning()
    if stored:
        return Interrupted(
            f"interrupted (Ctrl-C) right after run {run_id} was stored: nothing was sent. "
            f"`notifier resume {run_id}` sends it."
        )
    return Interrupted(
        f"interrupted (Ctrl-C) while storing the plan of {sending.batch} as run {run_id}; "
        f"nothing was sent. `notifier runs` shows whether it was stored: if so, `notifier "
        f"resume {run_id}` sends it, else run `{sending.again()}` again."
    )
