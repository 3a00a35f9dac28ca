"""Killed (-9) while the relay holds every message under way at --concurrency 8: at most the
pool's connections are in flight, every other item never attempted, and resume leaves at
most those unknown."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows, wait_for
from ..engine.test_smtp_pool import _states
from ..smtp_relay import relay


@pytest.mark.both_stores
@pytest.mark.parametrize(("options", "cap"), [("", 8), ("max_connections = 3\n", 3)])
def test_kill_9_at_n8_leaves_in_flight_only_the_requests_under_way(
    ws: Workspace, options: str, cap: int
) -> None:
    """Killed while the relay holds every message it has, at --concurrency 8: at most `cap`
    items (8, or max_connections) are in flight, every other one never attempted; resume
    leaves at most `cap` unknown (maybe delivered) and sends the rest once."""
    with relay(ws, options) as handler:
        handler.delay_s = 30.0  # held until the kill
        ws.write_csv("batch.csv", make_rows(40))
        process = ws.popen("send", "batch.csv", "--channel", "mail", "--concurrency", "8")
        try:
            wait_for(lambda: handler.active >= cap, f"{cap} messages under way at the relay")
        finally:
            process.kill()
            process.communicate()
        assert handler.max_active == cap
        states = _states(ws)
        assert states.get("in_flight", 0) <= cap, states
        attempted = {a.seq for a in ws.ledger.attempts()}
        never = [i for i in ws.ledger.items() if i.state == "pending" and i.seq not in attempted]
        assert len(never) == 40 - states.get("in_flight", 0), states
        handler.delay_s = 0.0
        resumed = ws.invoke("resume", "--concurrency", "8")  # in-process: the kill was above
        assert resumed.exit_code == 3, resumed.output
    states = _states(ws)
    assert states.get("unknown", 0) <= cap and states.get("sent", 0) == 40 - states["unknown"]
    keys = ws.ledger.keys("sent")
    assert all(handler.message_ids().count(f"<{k}@example.com>") == 1 for k in keys)
