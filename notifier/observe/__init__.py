"""Watching a run from outside: Prometheus metrics (metrics.py) and JSON event logs
(logs.py). The runner tells an Observer what happens at a handful of points (an attempt
starts, an answer comes, outcomes are recorded, a gate closes, a --rate wait ends); the
command gives it the observers its flags ask for.

This module imports neither prometheus_client nor json logging: the runner imports it on
every path, and without --metrics-port or --log-format json it gets the no-op `Observer`,
whose methods do nothing, so the default path costs a method call per event."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from notifier.domain.records import Item, Outcome
    from notifier.engine.coordination import RunResult
    from notifier.engine.judging import Sent


class Observer:
    """What the runner reports. Every method is called on the thread where the thing
    happened (a sender's for attempts and answers, the committer's for the rest), so an
    implementation must be thread-safe and quick: a send waits for it."""

    def planned(
        self, run_id: str, total: int, per_channel: dict[str, int], event: str = "plan"
    ) -> None:
        """A run was stored (`event` "plan": send) or taken up ("resume", "worker") with
        `total` items."""

    def attempt_started(self, item: Item) -> None:
        """The request for `item` is about to leave (its point A is committed)."""

    def answered(self, item: Item, result: Sent, started: datetime | None) -> None:
        """The downstream's answer (or the error) for `item`'s request that left at
        `started` (None: no request left)."""

    def recorded(self, done: Sequence[tuple[Item, object]], outcomes: Sequence[Outcome]) -> None:
        """`outcomes` (of some of the items in `done`, matched by seq) are committed."""

    def gated(self, channel: str, now: float, until: float) -> None:
        """`channel` is closed until monotonic `until` (a throttled answer), as of `now`."""

    def rate_waited(self, channel: str, seconds: float) -> None:
        """A sender spent `seconds` waiting for a --rate token of `channel`."""

    def ended(self, result: RunResult) -> RunResult:
        """The run stopped (completed, paused, halted, cancelled...); returns `result`."""
        return result

    def close(self) -> None:
        """The command is done: stop serving, flush."""


NULL_OBSERVER = Observer()


class Observers(Observer):
    """The observers the command's flags asked for (metrics, logs), told in turn. A failing
    observer is skipped: watching a run must never cost a send or its record."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = tuple(observers)

    def planned(
        self, run_id: str, total: int, per_channel: dict[str, int], event: str = "plan"
    ) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.planned(run_id, total, per_channel, event)

    def attempt_started(self, item: Item) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.attempt_started(item)

    def answered(self, item: Item, result: Sent, started: datetime | None) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.answered(item, result, started)

    def recorded(self, done: Sequence[tuple[Item, object]], outcomes: Sequence[Outcome]) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.recorded(done, outcomes)

    def gated(self, channel: str, now: float, until: float) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.gated(channel, now, until)

    def rate_waited(self, channel: str, seconds: float) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.rate_waited(channel, seconds)

    def ended(self, result: RunResult) -> RunResult:
        for o in self.observers:
            with suppress(Exception):
                o.ended(result)
        return result

    def close(self) -> None:
        for o in self.observers:
            with suppress(Exception):
                o.close()


def answer_outcome(result: Sent) -> str | None:
    """An answer as the attempts table names its outcome ("sent", or the error's kind);
    None for a request that never left. A small fixed vocabulary: safe as a label."""
    from notifier.domain.answers import ChannelError  # noqa: PLC0415
    from notifier.domain.records import AttemptOutcome  # noqa: PLC0415
    from notifier.engine.judging import NotStarted  # noqa: PLC0415

    if isinstance(result, NotStarted):
        return None
    if isinstance(result, ChannelError):
        return AttemptOutcome(result.kind.value).value
    return AttemptOutcome.SENT.value
