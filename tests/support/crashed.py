"""A crash at a rehearsal point (NOTIFIER_CRASH_AT's POINT:SEQ), in-process, for tests whose
subject is what comes after a crash (cancel, reconcile, resume, report, a second send), not
the crash itself: the real engine sends through the workspace's notifier.toml until the
committer reaches the point, and stops there as a kill -9 would, with nothing after it
recorded: the item's attempt open, its answer unrecorded, the items taken meanwhile in
flight.

What differs from a killed process: the lease is given up as the call unwinds, so the next
command takes the run at once, as it does from a holder that died on this host; and the
senders' requests already under way finish as the pipeline closes (a kill cuts them off,
unanswered). A promise about finding a dead holder (its pid, its lease on paper), about the
exit status 137, about requests cut off in flight, or about the process itself keeps a real
process killed at the point (tests/crash/)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notifier.api import Notifier
from notifier.channels.scripted import Channels
from notifier.config import Config
from notifier.content.schedule import from_options
from notifier.engine import crash
from notifier.engine.crash import CrashPlan

from .workspace import Workspace


class Crashed(BaseException):
    """The point was reached: nothing in the engine catches it, as nothing survives a kill."""


@dataclass(frozen=True)
class CrashHere(CrashPlan):
    """A CrashPlan that raises Crashed at its point instead of ending the process."""

    def at(self, point: str, seqs: Any) -> None:
        if point == self.point and self.seq in seqs:
            raise Crashed(f"{point}:{self.seq}")


@contextmanager
def rehearsing(spec: str) -> Iterator[CrashHere]:
    """NOTIFIER_CRASH_AT=`spec` (POINT:SEQ) for the engine run in the block, in-process."""
    point, _, seq = spec.partition(":")
    plan = CrashHere(point, int(seq))
    real = crash.from_env
    crash.from_env = lambda environ=None: plan
    try:
        yield plan
    finally:
        crash.from_env = real


def crash_send(
    spec: str,
    batch: str | Path = "batch.csv",
    *,
    db: str | Path,
    config: Config | Path | None = None,
    channels: Channels | None = None,
    **options: Any,
) -> None:
    """`notifier send BATCH [options]` with NOTIFIER_CRASH_AT=`spec`, in-process: returns
    once it has crashed at the point (fails the test if it ended without reaching it)."""
    notifier = Notifier.open(db, config=config, channels=channels)
    # As the command schedules every file (a row's own not_before and tz columns included);
    # the API schedules only when given a Schedule.
    options.setdefault("schedule", from_options(None, None, None, notifier.env.config.channels))
    with rehearsing(spec):
        try:
            ended = notifier.send(Path(batch), **options)
        except Crashed:
            return
    raise AssertionError(f"the send ended without reaching {spec}: {ended}")


def crash_resume(
    spec: str,
    run_id: str | None = None,
    *,
    db: str | Path,
    config: Config | Path | None = None,
    channels: Channels | None = None,
) -> None:
    """`notifier resume [RUN_ID]` with NOTIFIER_CRASH_AT=`spec`, in-process (see crash_send)."""
    notifier = Notifier.open(db, config=config, channels=channels)
    with rehearsing(spec):
        try:
            ended = notifier.work(run_id)
        except Crashed:
            return
    raise AssertionError(f"the resume ended without reaching {spec}: {ended}")


def crash_invoke(
    ws: Workspace, spec: str, *args: str, env: Mapping[str, str | None] | None = None
) -> None:
    """`notifier ARGS` in-process (ws.invoke) with NOTIFIER_CRASH_AT=`spec`: returns once it
    has crashed at the point (fails the test if the command ended without reaching it)."""
    with rehearsing(spec):
        try:
            ended = ws.invoke(*args, env=env)
        except Crashed:
            return
    raise AssertionError(f"`notifier {' '.join(args)}` ended without reaching {spec}: {ended}")
