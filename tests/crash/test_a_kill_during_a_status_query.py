"""Killed (-9) while an item's status query is held at the receiver: the item is left in
flight, its answer never recorded, and resume settles it by asking; every key committed
once."""

from __future__ import annotations

import threading

import pytest

from ..conftest import Workspace, make_rows
from ..engine.test_query_on_sender import ROWS, _sent_others, _u1
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.timeout(120)
def test_a_kill_during_the_held_query_leaves_the_item_for_resume_to_ask(
    ws: Workspace, n: int
) -> None:
    """Killed (-9) while u1's status query is held at the receiver: u1 is left in flight,
    its answer never recorded, and `resume` settles it by asking: found, sent by the query's
    receipt, its request made once; every key is committed exactly once."""
    receiver = Receiver(
        answer=lambda item, nth: 500 if item == "u1" and nth == 1 else None,
        commit_first=True,
        query_hold=threading.Event(),
    )
    assert receiver.query_hold is not None
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            # Killed the moment the query arrives, long before this timeout; a short one, as
            # resume waits timeout + query_delay before a 404 counts for the items in flight.
            webhook_config(receiver, idempotent=False, status=True, timeout=5)
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        process = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        try:
            receiver.wait_for(lambda r: len(r.queries) >= 1)  # u1's query is held
        finally:
            process.kill()
            process.communicate()
        assert _u1(ws) == ("in_flight", None)
        receiver.query_hold.set()
        resumed = ws.invoke("resume")  # in-process: the killed process is the one above
        assert resumed.exit_code == 0, resumed.output
    assert _u1(ws) == ("sent", "query")
    assert receiver.posts("u1") == 1
    assert _sent_others(ws) == ROWS - 1
    assert set(receiver.commits.values()) == {1}, "every key committed once"
