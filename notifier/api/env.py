"""What a command works in (its database, its configuration, where it says things), and how
a command that looks at a run begins: it opens the store and picks the run. Apart from
the API's modules, which load everything sending needs, so that `status`, `report` and `runs` start
without it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notifier.channels import Channel, build_channel
from notifier.config import Config
from notifier.domain.chain import UNKEYED
from notifier.domain.errors import BadInput, NextStep
from notifier.domain.records import Run
from notifier.domain.state_machine import FINISHED_RUN_STATES
from notifier.store import Store, Target

Say = Callable[[str], None]
# Makes a channel from its name and (snapshotted) definition: the real ones, or an in-process
# stand-in given to the API (channels/scripted.py), as a transport is given to an HTTP client.
ChannelBuilder = Callable[[str, dict[str, Any], Path], Channel]


@dataclass(frozen=True)
class Env:
    target: Target  # the --db, parsed once: an SQLite file or a PostgreSQL URL
    config: Config
    say: Say
    build: ChannelBuilder = build_channel

    @property
    def base_dir(self) -> Path:
        """Where relative channel paths (an outbox) are resolved."""
        return self.target.local_dir

    def may_hold_runs(self) -> bool:
        """Whether a read-only look may find runs (a server always may; a file must exist)."""
        return self.target.may_hold_runs()


def open_store(
    env: Env, *, create: bool = False, readonly: bool = False, audited: bool = False
) -> Store:
    """`audited`: read-only, for `verify`, which names rows that contradict each other
    instead of refusing the database that holds them."""
    signer = UNKEYED if readonly else env.config.signer()
    return Store.open(env.target, create=create, readonly=readonly or audited, signer=signer,
                      audited=audited)  # fmt: skip


def pick_run(store: Store, run_id: str | None, *, active_only: bool = False) -> Run:
    """RUN_ID, or the newest run (for resume and cancel: the newest not completed or
    cancelled)."""
    if run_id is not None:
        try:
            return store.core.get_run(run_id)
        except KeyError:
            raise BadInput(f"{store.path}: no run {run_id!r}.").advise(NextStep.LIST_RUNS) from None
    run = store.queries.newest_run(exclude=FINISHED_RUN_STATES if active_only else ())
    if run is None:
        what = "unfinished run" if active_only else "run"
        raise BadInput(f"{store.path}: there is no {what}.").advise(NextStep.LIST_RUNS)
    return run
