"""A process killed -9 right after it claimed items (point A committed, nothing sent), then
resumed once their not_after has passed. A status query settles each of them: the receiver
holds none of their keys, so once the window in which it could still commit a request has
passed (timeout + query_delay from the moment the resume found them left open), each is
expired, never sent, and the run is not halted.

On a webhook that dedupes by key the resume took the first, early 404 as a reason to send
again under the same key (pending, maybe delivered); the deadline then forbade that send,
and the claim made each item `unknown` with nothing asking about it again, five of them in a
row halting the run "check the downstream" with a downstream that answered every query;
the same resume on a webhook that does not dedupe settled them expired. Both stores, N = 1
and 8 (3N claimed ahead), both kinds of webhook."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send
from .test_not_after import iso_in

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]

ROWS = 40


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("n", [1, 8])
def test_items_claimed_before_a_kill_and_past_their_not_after_end_expired(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, idempotent: bool, n: int
) -> None:
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=idempotent, status=True, timeout=1,
                           query_delay=0.5)
        )  # fmt: skip
        rows = [["id", "to", "subject", "body", "not_after"]]
        deadline = iso_in(1800)
        rows += [[f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}", deadline]
                 for i in range(1, ROWS + 1)]  # fmt: skip
        batch = ws.write_csv("b.csv", rows)
        # Killed once the first claim is committed: 4N items in flight at N = 8, one at N = 1.
        crash_send("after-intent:1", batch, db=ws.db, concurrency=n, channel="hooks")
        claimed = ws.ledger.state_counts().get("in_flight", 0)
        assert claimed == (4 * n if n > 1 else 1)

        # Resumed an hour later (this process's clock), every deadline past.
        monkeypatch.setattr(clock, "_SHIFT", timedelta(seconds=3600))
        resumed = ws.invoke("resume", "--concurrency", str(n))
    assert receiver.commits == {}, "nothing was ever sent"
    assert ws.ledger.state_counts() == {"expired": ROWS}, resumed.output
    assert "halted" not in resumed.output, resumed.output
    assert resumed.exit_code == 3, resumed.output  # expired: never sent
    verified = ws.invoke("verify")
    assert verified.exit_code == 0, verified.output
