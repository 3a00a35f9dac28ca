"""The engine in a thread of the test, for a test that acts while a send runs (holds a
receiver, suppresses an address, watches the ledger) but needs no process: the same
`notifier.api` call the command makes, its result judged by the command's own exit rule."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from notifier.api import Notifier, Planned
from notifier.errors import ExitCode
from notifier.outcome import run_exit
from notifier.runner import RunResult

from .workspace import Workspace

WAIT_S = 60.0  # no send a test starts here outlasts this once its holds are released


class Background:
    """`call()` running in a daemon thread from construction; `result()` joins it and hands
    back what it returned, or raises what it raised."""

    def __init__(self, call: Callable[[], RunResult | Planned]) -> None:
        self._ended: list[RunResult | Planned | BaseException] = []

        def target() -> None:
            try:
                self._ended.append(call())
            except BaseException as error:  # handed to the test's thread, which raises it
                self._ended.append(error)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return bool(self._ended)

    def result(self, timeout: float = WAIT_S) -> RunResult:
        self.thread.join(timeout)
        assert self._ended, f"the send did not end within {timeout} s"
        (ended,) = self._ended
        if isinstance(ended, BaseException):
            raise ended
        assert isinstance(ended, RunResult), f"nothing was sent: {ended}"
        return ended


def send_in_background(ws: Workspace, channel: str, concurrency: int) -> Background:
    """`notifier send batch.csv --channel CHANNEL --concurrency N` in a thread, with the
    workspace's notifier.toml."""
    notifier = Notifier.open(ws.db, config=ws.path / "notifier.toml")
    return Background(
        lambda: notifier.send(Path("batch.csv"), channel=channel, concurrency=concurrency)
    )


def exit_code(result: RunResult) -> ExitCode:
    """What `send` or `resume` would have exited with for this result."""
    return run_exit(result)
