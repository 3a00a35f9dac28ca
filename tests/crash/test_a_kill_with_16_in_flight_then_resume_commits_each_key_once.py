"""A real process killed (status 137, no cleanup: its requests still under way are cut off,
unanswered) at any point with 16 sends in flight, then a resume: every key is committed at
the receiver exactly once. A crash in-process would let the senders' requests finish as
it unwinds; only a kill leaves them in flight for the resume to settle by query."""

from __future__ import annotations

import pytest

from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, make_rows
from ..engine import test_pipeline
from ..engine.test_pipeline import commits, configure_sandbox, keys

sandbox = test_pipeline.sandbox  # a fixture of that module's, found here by name


@pytest.mark.parametrize("point", ["after-intent", "after-send", "after-receipt"])
def test_a_kill_with_16_in_flight_then_resume_commits_each_key_once(
    ws: Workspace, sandbox: Sandbox, point: str
) -> None:
    configure_sandbox(ws, sandbox)
    ws.write_csv("batch.csv", make_rows(120))
    env = {"NOTIFIER_CRASH_AT": f"{point}:60"}
    crashed = ws.run("send", "batch.csv", "--channel", "hooks", "--concurrency", "16", env=env)
    assert crashed.returncode == 137, crashed.stderr
    resumed = ws.invoke("resume", "--concurrency", "16")
    assert resumed.exit_code == 0, resumed.output
    assert commits(sandbox) == {key: 1 for key in keys(ws)}
    assert ws.status()["counts"]["sent"] == 120
