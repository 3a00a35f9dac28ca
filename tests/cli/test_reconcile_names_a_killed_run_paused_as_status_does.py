"""A run whose process was killed is, in effect, paused (docs/design.md section 3): `status`,
`runs` and `report` say `paused`. `reconcile` after the kill, in its text and in its JSON,
names the same state, never `running` (which tells the operator a worker is still sending
and there is nothing to resume); nor does `reject` call it running."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_stores]


@pytest.fixture
def killed(ws: Workspace) -> str:
    """5 rows to the outbox, the process killed (exit 137, as kill -9) after item 3's send."""
    ws.write_csv("batch.csv", make_rows(5))
    crashed = ws.run(
        "send", "batch.csv", "--run-id", "k1", env={"NOTIFIER_CRASH_AT": "after-send:3"}
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    status = ws.invoke("status", "k1", "--json")
    assert json.loads(status.stdout)["state"] == "paused"
    return "k1"


def test_reconcile_json_after_a_kill_names_the_state_status_names(
    ws: Workspace, killed: str
) -> None:
    result = ws.invoke("reconcile", killed, "--json")
    assert "Traceback" not in result.output
    document = json.loads(result.stdout)
    status = json.loads(ws.invoke("status", killed, "--json").stdout)
    assert document["state"] == status["state"] == "paused", (document, status)


def test_reconcile_text_after_a_kill_never_calls_the_run_running(
    ws: Workspace, killed: str
) -> None:
    result = ws.invoke("reconcile", killed)
    assert f"run {killed}: paused" in result.output, result.output
    assert f"run {killed}: running" not in result.output


def test_reject_of_a_killed_run_never_calls_it_running(ws: Workspace, killed: str) -> None:
    result = ws.invoke("reject", killed, "--reason", "wrong file")
    assert result.exit_code == 2, result.output
    assert "is running" not in result.output, result.output
    assert "paused" in result.output
