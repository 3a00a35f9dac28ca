"""How a sending process is asked to stop: Ctrl-C (SIGINT) from an operator, SIGTERM from
systemd, `docker stop` or Kubernetes. Both mean the same thing the first time: finish the
requests already sent, record them, send nothing more, pause the run: the handler asks the
process's run control (run_control.py), which every check reads. The second either one
leaves at once (the next resume settles whatever was in flight)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

from notifier.engine.run_control import RunControl

# The exit status of a process stopped by a signal, as a shell reports it: 128 + the signal.
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


@contextmanager
def interrupt_guard(control: RunControl, say: Callable[[str], None]) -> Iterator[None]:
    """First SIGINT or SIGTERM: ask `control` to stop (finish what was already sent, record
    it, pause). A second one of either: leave now, with the exit status of the signal that
    asked first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if not control.interrupt(signal.Signals(signum)):
            os._exit(EXIT_STATUS[control.first_signal or signal.Signals(signum)])
        # A handler runs between any two bytecodes, inside a send too (a socket call checks
        # for signals after each chunk): if it raised (stderr a closed pipe), the send would
        # fail at a point it cannot account for, and a message handed to the relay could be
        # judged not sent.
        with suppress(Exception):
            say(
                f"{control.signal_name}: finishing the requests already sent, then pausing "
                "(Ctrl-C or SIGTERM again to quit now)"
            )

    previous = {sig: signal.signal(sig, handler) for sig in EXIT_STATUS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
