"""Runs built directly, for tests whose subject comes after the sending (a report, a look,
a command on a run that exists): the real planner stores them, as `send` does before its
first request, without a process and without sending the batch one item at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from notifier import config
from notifier.api import planning
from notifier.api.env import Env
from notifier.store import target

from .workspace import Workspace

# What `send` stores with a run when given no options.
SEND_DEFAULTS: dict[str, object] = {"concurrency": 1, "max_wait": 600.0, "rate": None}


def plan_run(
    ws: Workspace,
    rows: Sequence[Sequence[str]],
    *,
    name: str = "batch.csv",
    channel: str | None = None,
    run_id: str | None = None,
) -> str:
    """Write `rows` to `name` and store its plan in `ws` exactly as `notifier send NAME`
    would before sending (the same planner, the same transaction, ws's notifier.toml), with
    nothing sent: every item pending, never attempted. The run's id."""
    batch = ws.write_csv(name, rows)
    env = Env(
        target=target.parse(ws.db),
        config=config.load(ws.path / "notifier.toml", explicit=False),
        say=lambda line: None,
    )
    plan = planning.plan_batch(env, Path(batch), channel=channel, run_id=run_id)
    stored = planning.store_plan(env, plan, Path(batch), SEND_DEFAULTS, new_run=False)
    assert stored.store is not None, f"nothing left to plan in {name}"
    stored.store.close()
    return plan.run_id
