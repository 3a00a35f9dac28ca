"""Something running while a test acts, in-process: a worker (the API's `send` or `work`) in a
thread where a test used to start a `send` process only to act while it ran, and an action
in a thread while the test's own thread runs a command that waits on it. Every wait is
bounded; a failure in the thread fails the test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from notifier.api import Notifier, Planned
from notifier.cli.outcome import run_exit
from notifier.domain.errors import ExitCode
from notifier.engine.runner import RunResult

from .workspace import Workspace

WAIT_S = 60.0  # no thread here is waited for longer than this


class Worker:
    """`call` (e.g. `Notifier.open(ws.db).send(...)`) in a daemon thread, as a worker
    process would run it; `exit_code()` is what that process would have exited with."""

    def __init__(self, call: Callable[[], RunResult | Planned]) -> None:
        self._results: list[RunResult | Planned] = []
        self._failed: list[BaseException] = []

        def run() -> None:
            try:
                self._results.append(call())
            except BaseException as error:  # re-raised in the test's thread
                self._failed.append(error)

        self.thread = threading.Thread(target=run, name="test-worker", daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def result(self, timeout: float = WAIT_S) -> RunResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the worker still runs after {timeout} s"
        if self._failed:
            raise self._failed[0]
        (result,) = self._results
        assert isinstance(result, RunResult), result
        return result

    def exit_code(self, timeout: float = WAIT_S) -> int:
        """The exit code of `send` or `resume` for the result (outcome.run_exit)."""
        return int(run_exit(self.result(timeout)))


@contextmanager
def meanwhile(action: Callable[[], Any]) -> Iterator[None]:
    """`action` in a thread while the block runs a command in-process that waits on what
    the action releases; the action's failure fails the test once the block is done (an
    action that releases a hold does so in a `finally`, so the command is never stranded)."""
    failed: list[BaseException] = []

    def act() -> None:
        try:
            action()
        except BaseException as error:  # re-raised in the test's thread
            failed.append(error)

    thread = threading.Thread(target=act, name="test-meanwhile", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(WAIT_S)
    if failed:
        raise failed[0]


def send_in_background(ws: Workspace, channel: str, concurrency: int) -> Worker:
    """`notifier send batch.csv --channel CHANNEL --concurrency N` in a thread, with the
    workspace's notifier.toml."""
    notifier = Notifier.open(ws.db, config=ws.path / "notifier.toml")
    return Worker(
        lambda: notifier.send(Path("batch.csv"), channel=channel, concurrency=concurrency)
    )


def exit_code(result: RunResult) -> ExitCode:
    """What `send` or `resume` would have exited with for this result."""
    return run_exit(result)
