"""`redraft` of a run that was not drafted by Claude advises cancelling it and sending its
file again. For a run already finished (completed, or cancelled or rejected) that advice
does not work as printed: `notifier cancel RUN` answers "already completed; nothing to
cancel". The refusal (exit 2, nothing changed) never advises cancelling a finished run."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("ending", ["completed", "cancelled", "rejected"])
def test_redraft_of_a_finished_plain_run_never_advises_cancel(ws: Workspace, ending: str) -> None:
    ws.write_csv("b.csv", make_rows(3))
    if ending == "completed":
        assert ws.invoke("send", "b.csv", "--run-id", "r1").exit_code == 0
    else:
        assert ws.invoke("send", "b.csv", "--run-id", "r1", "--require-approval").exit_code == 0
        closed = (
            ws.invoke("cancel", "r1")
            if ending == "cancelled"
            else ws.invoke("reject", "r1", "--reason", "wrong file")
        )
        assert closed.exit_code in (0, 3), closed.output
    result = ws.invoke("redraft", "r1", "--item", "u1")
    assert result.exit_code == 2, result.output
    assert "`notifier cancel r1`" not in result.output, result.output
    # What it names instead works as printed on this run.
    again = ws.invoke("cancel", "r1")
    assert "nothing to cancel" in again.output  # why the advice would not have worked
