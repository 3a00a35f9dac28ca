"""A plan killed (-9) leaves its scratch stage in the temp directory; the next plan removes it
once its process is gone, and leaves a live process's alone."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows


def test_a_stage_left_by_a_killed_plan_is_removed_by_the_next(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan killed with SIGKILL leaves its stage (every recipient and payload) in the temp
    directory; the next plan removes it once its process is gone and an hour has passed,
    and leaves a live process's stage alone."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    ws.write_csv("big.csv", make_rows(200_000))
    planning = ws.popen("send", "big.csv", env=env)
    deadline = time.monotonic() + 60
    while not list(scratch.glob("notifier-plan-*/stage.db")) and time.monotonic() < deadline:
        time.sleep(0.05)
    planning.send_signal(signal.SIGKILL)
    planning.wait(timeout=60)
    (left,) = scratch.iterdir()
    live = scratch / f"notifier-plan-{os.getpid()}-live"  # this test's own process
    live.mkdir()
    hour_ago = time.time() - 3700
    for path in (left, *left.iterdir(), live):
        os.utime(path, (hour_ago, hour_ago))
    ws.write_csv("small.csv", make_rows(10))
    # The next plan in-process, staging in the same directory (TMPDIR is read once, so the
    # temp directory is set as the process started with TMPDIR would have it).
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    sent = ws.invoke("send", "small.csv")
    assert sent.exit_code == 0, sent.output
    assert list(scratch.iterdir()) == [live]
    assert len(ws.ledger.runs()) == 1  # the killed plan stored nothing
