"""Watching runs from outside: the --metrics-port, --log-format and --log-bodies options of
`send`, `resume` and `worker`, and `notifier metrics`. prometheus_client loads only when a
command asks for metrics (`status` and the other looks never load it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from notifier.api.env import Env, open_store, pick_run
from notifier.cli.group import cli, command_env, echo

if TYPE_CHECKING:
    from notifier.observe import Observer


def observe_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options that send, resume and worker share to be watched while they run."""
    for option in reversed(
        (
            click.option(
                "--metrics-port",
                type=click.IntRange(1, 65535),
                metavar="PORT",
                help="Serve Prometheus metrics on 127.0.0.1:PORT while the command runs.",
            ),
            click.option(
                "--log-format",
                type=click.Choice(["text", "json"]),
                default="text",
                show_default=True,
                help="json: one JSON object per event (plan, attempt, answer, outcome, pause, "
                "halt, cancel) on stderr; stdout keeps the report.",
            ),
            click.option(
                "--log-bodies",
                is_flag=True,
                help="With --log-format json: add each attempt's recipient, subject and body.",
            ),
        )
    ):
        command = option(command)
    return command


def make_observer(env: Env, metrics_port: int | None, log_format: str, bodies: bool) -> Observer:
    """The observer the options ask for; the no-op one without them. With --metrics-port
    the port is bound here, before anything is stored: one in use is exit 2."""
    from notifier.observe import NULL_OBSERVER, Observers  # noqa: PLC0415

    observers: list[Observer] = []
    if metrics_port is not None:
        from notifier.observe.metrics import MetricsServer  # noqa: PLC0415 (prometheus_client)

        observers.append(MetricsServer(metrics_port, lambda: open_store(env, readonly=True)))
    if log_format == "json":
        from notifier.observe.logs import JsonLog  # noqa: PLC0415

        observers.append(JsonLog(bodies=bodies))
    elif bodies:
        echo("note: --log-bodies has no effect without --log-format json", err=True)
    # Even one goes through Observers, which keeps a failing observer from a send.
    return Observers(observers) if observers else NULL_OBSERVER


@cli.command()
@click.argument("run_id", required=False)
@click.pass_context
def metrics(ctx: click.Context, run_id: str | None) -> None:
    """Print a run's metrics from the database in Prometheus text format (default: the
    newest run): for node_exporter's textfile collector. Read-only."""
    from notifier.observe.metrics import exposition  # noqa: PLC0415 (prometheus_client)

    env = command_env(ctx)
    store = open_store(env, readonly=True)
    try:
        run = pick_run(store, run_id)
        click.echo(exposition(store, [run.run_id]), nl=False)
    finally:
        store.close()
