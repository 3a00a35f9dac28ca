"""A cancel or a signal that arrives while the process is waiting or writing: at N = 1 a
`--rate` wait on the committer's own thread still sees a cancel, and a signal handler whose
message cannot be written never breaks the send it interrupted. Both stores where it
matters, the sender in-process (the API) and `cancel` through the CLI, against a receiver
on 127.0.0.1."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.engine.run_control import RunControl
from notifier.engine.signals import interrupt_guard

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.background import Worker


@pytest.mark.both_stores
@pytest.mark.timeout(90)
def test_a_cancel_during_a_rate_wait_at_n1_is_seen_and_nothing_more_is_sent(
    ws: Workspace,
) -> None:
    """At N = 1 with --rate 0.05 (the next token 20 s away), a cancel after the first
    delivery is confirmed within its --wait and no second request leaves: the wait reads the
    run's flags, though it holds up the committer's turn."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(3))
        notifier = Notifier.open(ws.db)
        sending = Worker(
            lambda: notifier.send(Path("batch.csv"), channel="hooks", concurrency=1, rate=0.05)
        )
        receiver.wait_for(lambda r: len(r.commits) == 1)
        cancelled = ws.invoke("cancel", "--wait", "10")
        result = sending.result()
    assert "did not confirm" not in cancelled.output, cancelled.output
    assert ws.ledger.run().state == "cancelled", result
    assert len(receiver.arrivals) == 1, "a request left after the cancel was committed"


@pytest.mark.timeout(30)
def test_a_signal_whose_message_cannot_be_written_does_not_raise_into_the_send() -> None:
    """The first SIGINT is recorded even when its message fails to write (stderr a closed
    pipe): the handler raises nothing into whatever it interrupted, a send included."""
    interrupted = RunControl()

    def broken(_line: str) -> None:
        raise BrokenPipeError("stderr is a closed pipe")

    with interrupt_guard(interrupted, broken):
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode, in this block
        for _ in range(1000):
            if interrupted.signalled:
                break
    assert interrupted.signalled
