"""A receipts.db moved away (or removed) while a run writes it: SQLite goes on writing the
file it has open, its last commits into a -wal left beside the old name, which it then
never checkpoints (the file moved). A run that went on would send every row and say
"completed", exit 0, while the file the operator holds says the run is paused with rows
pending, which its resume sends again (on a channel that cannot dedupe: twice). So the
run stops at its next commit, exit 3, naming the move and the way back; put back, the
advised resume delivers each row exactly once."""

from __future__ import annotations

import re

import pytest

from notifier.sandbox.faults import Faults
from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, make_rows
from ..support.workspace import wait_for

ROWS = 400


@pytest.mark.timeout(180)
def test_a_database_moved_away_under_a_run_stops_it_and_put_back_resumes_exactly_once(
    ws: Workspace,
) -> None:
    ws.write_csv("batch.csv", make_rows(ROWS))
    moved = ws.path / "elsewhere.db"
    with Sandbox(faults=Faults(latency_ms=5)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            f'status_url = "{sandbox.url}/notifications/{{key}}"\nidempotent = true\n'
        )
        sender = ws.popen("send", "batch.csv", "--channel", "hooks")
        wait_for(lambda: sandbox.stats()["totals"]["commits"] >= 20, "the run sending")
        ws.db_file.rename(moved)
        _, stderr = sender.communicate(timeout=120)
        assert sender.returncode == 3, stderr
        assert "moved or removed" in stderr, stderr
        assert "Traceback" not in stderr and "internal error" not in stderr
        assert sandbox.stats()["totals"]["commits"] < ROWS  # it stopped, never went on
        advised = re.search(r"`notifier (resume \S+)`", stderr)
        assert advised is not None, stderr

        moved.rename(ws.db_file)
        resumed = ws.invoke(*advised.group(1).split())
        assert resumed.exit_code == 0, resumed.output
        stats = sandbox.stats()
    assert stats["totals"]["commits"] == ROWS
    assert all(entry["commits"] == 1 for entry in stats["keys"].values())
    assert ws.ledger.state_counts() == {"sent": ROWS}
