"""Adversarial review of issue 22's decision rewrite (one decision, the status query on the
sender's thread): each test pins a defect found on main, through the real CLI against a
receiver on 127.0.0.1 (tests/receiver.py), on both stores."""

from __future__ import annotations

import pytest

from .conftest import Workspace, make_rows
from .receiver import WAIT_S, Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores

ROWS = 40
N = 8
# As many uncertain answers as the unknown-streak limit (RunOptions: 5): the senders' brake
# (Dispatch.may_start) holds every other send back until the committer has judged them.
UNCERTAIN = {f"u{i}" for i in range(1, 6)}


def _not_started(ws: Workspace) -> int:
    """Attempts closed as `not_started`: claimed, held back by a sender, released."""
    ((count,),) = ws.query("SELECT COUNT(*) FROM attempts WHERE outcome = 'not_started'")
    return int(count)


@pytest.mark.timeout(120)
def test_queries_holding_the_brake_do_not_spin_the_committer(ws: Workspace) -> None:
    """At N = 8, five uncertain answers (the streak limit) whose status queries take 2 s each
    on their senders hold every other send back: the committer waits for them, it does not
    claim and release the held items over and over (one commit and one `not_started` attempt
    row each, thousands a second)."""
    receiver = Receiver(
        # The five are committed, their answer lost (500): found by the query. Every other
        # item is refused (400), so no receipt resets the senders' count of doubts.
        answer=lambda item, nth: 500 if item in UNCERTAIN else 400,
        commit_first=True,
        query_delay_s=2.0,  # the receiver's own slowness: each query answers after 2 s
    )
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=WAIT_S)
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        done = ws.run(
            "send", "batch.csv", "--channel", "hooks", "--concurrency", str(N), timeout=90
        )
    assert "completed" in done.stdout, done.stdout + done.stderr
    counts = ws.status()["counts"]
    assert (counts["sent"], counts["failed"]) == (len(UNCERTAIN), ROWS - len(UNCERTAIN))
    assert all(receiver.posts(item) == 1 for item in UNCERTAIN)
    # An item claimed ahead may be held back by the brake once or twice (as the brake
    # engages, and once more before its answers are judged), not thousands of times.
    assert _not_started(ws) <= 2 * ROWS, f"{_not_started(ws)} attempts released unstarted"
