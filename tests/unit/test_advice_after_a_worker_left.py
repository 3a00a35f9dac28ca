"""What a worker that left a shared run advises (cli/outcome.run_advice): `resume` when the
run it left was paused by another worker's interruption; otherwise to follow the run, which
the other workers were still sending when it left, even if they have finished it since."""

from __future__ import annotations

import pytest

from notifier.cli.outcome import run_advice
from notifier.domain.records import Counts
from notifier.domain.state_machine import RunState
from notifier.engine.run_control import Stop
from notifier.engine.runner import RunResult


def _left(state: RunState) -> RunResult:
    return RunResult(state, Stop.LEFT, "left", Counts(sent=3, pending=2))


def test_a_run_paused_by_another_workers_interruption_is_resumed() -> None:
    assert run_advice(_left(RunState.PAUSED), "x1", "again") == (
        "Continue with `notifier resume x1`."
    )


@pytest.mark.parametrize("state", [RunState.RUNNING, RunState.COMPLETED])
def test_a_run_others_were_sending_is_followed_not_resumed(state: RunState) -> None:
    advice = run_advice(_left(state), "x1", "again")
    assert "still being sent by the other live workers" in advice
    assert "`notifier status x1`" in advice and "resume" not in advice
