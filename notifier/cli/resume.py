"""`notifier resume` and `notifier worker`: continue a stored run, alone or as one of many
workers sharing it through PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import click

from notifier.cli import running, watching
from notifier.cli.group import cli, command_env, echo
from notifier.domain.errors import BadInput, ExitCode
from notifier.domain.state_machine import FINISHED_RUN_STATES, RunState
from notifier.ops import approval


def _overrides(command: Callable[..., None]) -> Callable[..., None]:
    """The options `resume` and `worker` share: what may differ from the run's own."""
    for option in reversed(
        (
            click.argument("run_id", required=False),
            click.option(
                "--concurrency", type=click.IntRange(1, 64), help="Override the run's window size."
            ),
            click.option("--max-wait", type=running.WAIT, help="Override the run's --max-wait."),
            click.option(
                "--rate",
                type=running.RATE,
                help="Override the run's --rate (sends per second on each channel).",
            ),
            watching.observe_options,
            click.pass_context,
        )
    ):
        command = option(command)
    return command


@cli.command()
@_overrides
@click.option("--model", help="A run still drafting: the model for the rows not drafted yet.")
@click.option(
    "--recreate",
    is_flag=True,
    help="A run drafting through batches: create again a batch whose creation is in doubt "
    "(it may be paid twice) instead of waiting to recognise it.",
)
def resume(
    ctx: click.Context,
    run_id: str | None,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
    metrics_port: int | None,
    log_format: str,
    log_bodies: bool,
    model: str | None,
    recreate: bool,
) -> None:
    """Settle every in-flight item by asking the downstream, then continue in order.

    \b
    Examples:
      notifier resume                        # the newest run not completed or cancelled
      notifier resume RUN --concurrency 16 --rate 50
    """
    watch = (metrics_port, log_format, log_bodies)
    _resume(
        ctx,
        run_id,
        concurrency,
        max_wait,
        rate,
        watch,
        joining=False,
        model=model,
        recreate=recreate,
    )


@cli.command()
@_overrides
def worker(
    ctx: click.Context,
    run_id: str | None,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
    metrics_port: int | None,
    log_format: str,
    log_bodies: bool,
) -> None:
    """Join a run in a PostgreSQL database as one more worker, on any machine."""
    if not ctx.obj["db"].shares_runs:
        raise BadInput(
            f"{ctx.obj['db']}: `notifier worker` shares a run among processes through "
            "PostgreSQL (--db postgresql://…); an SQLite file is worked by one process at a "
            "time: use `notifier resume`."
        )
    watch = (metrics_port, log_format, log_bodies)
    _resume(ctx, run_id, concurrency, max_wait, rate, watch, joining=True)


def _resume(
    ctx: click.Context,
    run_id: str | None,
    concurrency: int | None,
    max_wait: float | None,
    rate: float | None,
    watch: tuple[int | None, str, bool],
    *,
    joining: bool,
    model: str | None = None,
    recreate: bool = False,
) -> None:
    """`resume`, or with `joining` a `worker`, which finds a run already finished normal."""
    from notifier.api import Notifier, Resuming  # noqa: PLC0415
    from notifier.cli.outcome import send_again, settled_exit  # noqa: PLC0415
    from notifier.content import compose  # noqa: PLC0415 (start-up time)
    from notifier.engine import crash  # noqa: PLC0415 (start-up time)

    env = command_env(ctx)
    rehearsal = crash.from_env()
    # --metrics-port is bound before anything is stored (a port in use: exit 2).
    observer = watching.make_observer(env, *watch)
    ctx.call_on_close(observer.close)
    notifier = Notifier(env)
    run = notifier.run(run_id, active_only=not joining or run_id is None)
    if run.state in FINISHED_RUN_STATES:
        if joining:
            counts = notifier.counts(run.run_id)
            echo(f"run {run.run_id} is already {run.state.value}: {counts.summary()}")
            ctx.exit(settled_exit(run.state, counts))
        raise BadInput(f"run {run.run_id} is {run.state.value}; there is nothing to resume.")
    if rehearsal is not None and not compose.unfrozen(run):
        # Checked before anything is taken up: a rehearsal that cannot fire is refused.
        item = notifier.item(run.run_id, rehearsal.seq)
        rehearsal.check_reachable(None if item is None else item.state, run.run_id)
    if model is not None or recreate:
        run = notifier.redraft_with(run, model, recreate)
    failures = 0
    if compose.unfrozen(run):
        drafted = running.draft(ctx, notifier, run.run_id)
        run, failures = drafted.run, running.report_draft_failures(drafted)
        if run.state is RunState.AWAITING_APPROVAL:
            echo(f"fingerprint: {run.fingerprint}")
            running.await_approval(notifier, run)
            ctx.exit(ExitCode.ATTENTION if failures else ExitCode.DONE)
    counts = notifier.counts(run.run_id)

    def announce(resuming: Resuming) -> None:
        # Only once the lease is held: a refusal (its approval, a live worker) takes nothing up.
        observer.planned(run.run_id, resuming.counts.total, {}, "worker" if joining else "resume")
        echo(f"resuming run {run.run_id}: {resuming.counts.summary()}")
        if resuming.past_deadline:
            echo(
                f"{resuming.past_deadline} pending item(s) are already past their not_after: "
                "they will be expired, not sent."
            )

    with running.progress(counts.unfinished, quiet=watch[1] == "json") as advance:
        try:
            result = notifier.work(
                run.run_id,
                concurrency=concurrency,
                max_wait=max_wait,
                rate=rate,
                joining=joining,
                advance=advance,
                announce=announce,
                observer=observer,
            )
        except approval.NotApproved as refused:
            raise running.not_approved(refused) from refused
    running.finish(ctx, run.run_id, result, failures, again=send_again(run.batch_path, run.options))
