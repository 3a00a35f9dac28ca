"""DESIGN.md section 8, `send`: "a `NOTIFIER_CRASH_AT` that cannot fire is refused". SEQ is the
row's 1-based position in the file (the stored item keeps it as its seq); a row an earlier run
already delivered with the same content is not planned again, and an item whose recipient is
suppressed is stored but never sent: a rehearsal naming either can never fire. It must be
refused (exit 2, nothing stored) as a SEQ beyond the file is, never run to a clean exit 0 that
makes the rehearsal look passed. Both stores; real processes (a rehearsal that did fire would
end a test run in-process)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


def test_a_crash_point_on_a_row_already_delivered_is_refused(ws: Workspace) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    first = ws.run("send", "batch.csv", "--run-id", "r1")
    assert first.returncode == 0, first.stdout + first.stderr
    ws.write_csv("batch.csv", make_rows(4))  # rows 1-3 delivered by r1; row 4 is new
    rehearsal = ws.run(
        "send", "batch.csv", "--run-id", "r2", env={"NOTIFIER_CRASH_AT": "after-send:2"}
    )
    said = rehearsal.stdout + rehearsal.stderr
    assert rehearsal.returncode == 2, said
    assert "cannot fire" in said, said
    runs = ws.run("runs", "--json")
    assert '"r2"' not in runs.stdout, runs.stdout  # nothing stored


def test_a_crash_point_on_a_suppressed_recipient_is_refused(ws: Workspace) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    added = ws.run("suppress", "add", "user2@example.com")
    assert added.returncode == 0, added.stdout + added.stderr
    rehearsal = ws.run(
        "send", "batch.csv", "--run-id", "r1", env={"NOTIFIER_CRASH_AT": "after-send:2"}
    )
    said = rehearsal.stdout + rehearsal.stderr
    assert rehearsal.returncode == 2, said
    assert "cannot fire" in said, said
    runs = ws.run("runs", "--json")
    assert '"r1"' not in runs.stdout, runs.stdout  # nothing stored
