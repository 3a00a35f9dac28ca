"""A cancel asked for while a worker still works the run (`cancel` that exits 3, "the worker
did not confirm within Ns, so a request may still start until it does") is not finished:
until that worker next reads the run's flags, a sender that frees up starts the next item
claimed ahead (docs/guarantees.md, Cancel: the cancel waits for such a send). `status`
meanwhile must never say "nothing more is sent": here a request starts after it said so.
Both stores."""

from __future__ import annotations

import pytest

from notifier.store import Store

from ..conftest import Workspace
from ..support.held import WAIT_S, Answered, HeldRun

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


# At N = 1 nothing is claimed ahead (pipeline.claim_ahead): an item is claimed only for a
# free sender, in a claim that reads the cancel, so no request can start after it.
@pytest.mark.parametrize("n", [2, 8])
def test_status_of_a_run_whose_live_worker_has_not_seen_the_cancel_yet(
    ws: Workspace, n: int
) -> None:
    channel = Answered()
    run = HeldRun(ws, channel, n, 4 * n)  # N under way, 3N claimed ahead
    run.thread.start()
    canceller = Store.open(ws.db)
    try:
        channel.wait_started(n)
        # The first answer taken up; the committer is held on it (a slow commit), before it
        # reads the run's flags again. Its sender has started its next item meanwhile.
        channel.let_go("1")
        assert run.held.reached.wait(WAIT_S), "the committer never took up the answer"
        channel.wait_started(n + 1)
        assert canceller.ledger.request_cancel("r1")  # what `cancel` writes first
        status = ws.invoke("status", "r1").output
        before = len(channel.started)
        # A sender frees up: it starts the next item claimed ahead.
        channel.let_go("2")
        channel.wait_started(before + 1)
        started_after = [item for item, _ in channel.started[before:]]
    finally:
        result = run.finish(channel)
        canceller.close()
    assert result.stop.value == "cancelled", result
    assert started_after, "no request started after the status"
    # A request started after `status` said that nothing more is sent.
    assert "nothing more is sent" not in status, (started_after, status)
