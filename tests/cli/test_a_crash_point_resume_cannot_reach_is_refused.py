"""DESIGN.md section 8: "a `NOTIFIER_CRASH_AT` that cannot fire is refused". A run planned with
`--require-approval` is sent by `resume` only, so its rehearsal is given to `resume`; one
naming an item the run does not have (or one already sent) can never fire there, and must be
refused (exit 2, nothing sent) as `send` refuses it, never run to a clean exit 0 that makes
the rehearsal look passed. Real processes: a rehearsal that fired would end a test run
in-process."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


@pytest.mark.parametrize("seq", ["9", "1"])
def test_resume_refuses_a_crash_point_it_cannot_reach(ws: Workspace, seq: str) -> None:
    ws.write_csv("batch.csv", make_rows(2))
    planned = ws.run("send", "batch.csv", "--run-id", "r1", "--require-approval")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    fingerprint = json.loads(ws.run("status", "r1", "--json").stdout)["fingerprint"]
    approved = ws.run("approve", "r1", "--fingerprint", fingerprint)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    if seq == "1":  # item 1 sent by a first resume that crashed once its receipt was stored
        first = ws.run("resume", "r1", env={"NOTIFIER_CRASH_AT": "after-receipt:1"})
        assert first.returncode == 137, first.stdout + first.stderr
        states = {
            i["seq"]: i["state"]
            for i in json.loads(ws.run("report", "r1", "--json").stdout)["items"]
        }
        assert states[1] == "sent", states
    rehearsal = ws.run("resume", "r1", env={"NOTIFIER_CRASH_AT": f"after-send:{seq}"})
    said = rehearsal.stdout + rehearsal.stderr
    assert rehearsal.returncode == 2, said
    assert "cannot fire" in said, said
