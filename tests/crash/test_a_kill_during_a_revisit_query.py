"""Killed (-9) while an item's revisit query is held at the receiver: the item stays unknown,
nothing recorded for it, and resume settles it by asking; every key committed once."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..engine.test_revisit_on_sender import QUERY_DELAY_S, _receiver, _rows, _sent_others, _u1
from ..receiver import receiving, webhook_config

pytestmark = pytest.mark.both_stores


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.timeout(120)
def test_a_kill_during_the_held_revisit_query_leaves_the_item_for_resume_to_ask(
    ws: Workspace, n: int
) -> None:
    """Killed (-9) while u1's revisit query is held: u1 stays unknown, nothing recorded
    for it, and `resume` settles it by asking (nothing found, after its query_delay: sent
    again under its key); every item ends sent and every key is committed exactly once."""
    receiver, hold = _receiver()
    rows = _rows(n)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            # Killed the moment the query arrives, long before this timeout; a short one, as
            # resume waits timeout + query_delay before a 404 counts for the items in flight.
            webhook_config(
                receiver, idempotent=False, status=True, timeout=5, query_delay=QUERY_DELAY_S
            )
        )
        ws.write_csv("batch.csv", make_rows(rows))
        process = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        try:
            receiver.wait_for(lambda r: len(r.queries) >= 2)  # the revisit's query is held
        finally:
            process.kill()
            process.communicate()
        assert _u1(ws) == "unknown"
        hold.set()
        resumed = ws.invoke("resume")  # in-process: the killed process is the one above
        assert resumed.exit_code == 0, resumed.output
    assert _u1(ws) == "sent"
    assert receiver.posts("u1") == 2
    assert _sent_others(ws) == rows - 1
    assert set(receiver.commits.values()) == {1}, "every key committed once"
