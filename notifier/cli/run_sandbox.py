"""`notifier sandbox`: the local provider with fault injection (notifier/sandbox/server.py), run
from the command line. Its HTTP server loads only when the command runs."""

from __future__ import annotations

import click

from notifier.cli.group import cli, echo, say
from notifier.domain.errors import BadInput


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8025,
    show_default=True,
    help="Port (0: any free port).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for fault injection.")
@click.option("--latency-ms", type=click.FloatRange(0), default=0, help="Delay before answering.")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0, help="Share answered 503.")
@click.option(
    "--throttle-rate",
    type=click.FloatRange(0, 1),
    default=0,
    help="Share answered 429 with Retry-After.",
)
@click.option(
    "--retry-after",
    type=click.FloatRange(0),
    default=1,
    show_default=True,
    help="Seconds in the 429's Retry-After.",
)
@click.option("--error-rate", type=click.FloatRange(0, 1), default=0, help="Share answered 500.")
@click.option(
    "--drop-rate",
    type=click.FloatRange(0, 1),
    default=0,
    help="Share committed, then dropped without an answer.",
)
@click.option("--no-idempotent", is_flag=True, help="Every POST is a new delivery (no dedupe).")
@click.option(
    "--force-status",
    multiple=True,
    metavar="ITEM_ID=CODE",
    help="Always answer CODE for this item id (repeatable).",
)
def sandbox(
    host: str,
    port: int,
    seed: int,
    latency_ms: float,
    fail_rate: float,
    throttle_rate: float,
    retry_after: float,
    error_rate: float,
    drop_rate: float,
    no_idempotent: bool,
    force_status: tuple[str, ...],
) -> None:
    """Run a local notification provider with fault injection, for rehearsals and tests."""
    from notifier.sandbox.server import Faults, run_sandbox  # noqa: PLC0415 (start-up time: an HTTP server)

    forced: dict[str, int] = {}
    for spec in force_status:
        item_id, _, code = spec.rpartition("=")
        if not item_id or not (code.isascii() and code.isdigit()):
            raise BadInput(f"--force-status {spec!r}: use ITEM_ID=CODE, e.g. u3=410.")
        forced[item_id] = int(code)
    try:
        faults = Faults(
            seed=seed,
            latency_ms=latency_ms,
            fail_rate=fail_rate,
            throttle_rate=throttle_rate,
            retry_after=retry_after,
            error_rate=error_rate,
            drop_rate=drop_rate,
            idempotent=not no_idempotent,
            force_status=forced,
        )
        run_sandbox(host, port, faults, say)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    except OSError as exc:
        raise BadInput(
            f"cannot listen on {host}:{port} ({exc.strerror}): choose another --port."
        ) from exc
    echo("sandbox stopped.")
