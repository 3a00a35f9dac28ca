"""The runs tests/support/runs.py builds directly are the runs `send` stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..support.runs import plan_run

pytestmark = pytest.mark.both_stores


@pytest.mark.timeout(60)
def test_a_planned_run_is_what_send_would_store(ws: Workspace) -> None:
    """plan_run stores the fingerprint `send --dry-run` computes for the same file, every
    item pending and never attempted, and `send` of that file then finds its rows open."""
    run_id = plan_run(ws, make_rows(50))
    dry = ws.invoke("send", "batch.csv", "--dry-run")
    assert dry.exit_code == 0, dry.output
    status = ws.status()
    assert (status["run_id"], status["state"]) == (run_id, "planned")
    assert f"fingerprint: {status['fingerprint']}" in dry.output
    assert status["counts"]["pending"] == 50
    assert ws.ledger.attempts() == []
    again = ws.invoke("send", "batch.csv")
    assert again.exit_code == 2 and "still open" in again.output, again.output
