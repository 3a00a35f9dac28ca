"""After a kill -9 with requests under way on a channel that can neither be asked about a key
nor trusted to deduplicate one, `resume` leaves those items unknown and its advice names
`notifier reconcile --manual`. Following it (a mark per item, from what the receiver holds)
delivers every row exactly once. Real processes, both stores, N = 1 and 8."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import HoldAfter, Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


@pytest.mark.parametrize("n", [1, 8])
def test_the_manual_marks_the_advice_names_settle_a_killed_run_and_send_nothing_twice(
    ws: Workspace, n: int
) -> None:
    # The first 2n answers go through; every later request is committed and its answer held:
    # the kill comes with n deliveries made that the sender never heard of.
    hold = HoldAfter(2 * n)
    receiver = Receiver(answer_hold=hold)
    rows = 5 * n
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        ws.write_csv("batch.csv", make_rows(rows))
        sender = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n),
                          "--run-id", "blast")  # fmt: skip
        try:
            receiver.wait_for(lambda r: len(r.commits) == 3 * n)
        finally:
            sender.kill()
            sender.communicate(timeout=30)
            hold.set()
        held = {a.key for a in receiver.arrivals[2 * n :]}

        resumed = ws.invoke("resume", "blast", "--concurrency", str(n))
        assert resumed.exit_code == 3, resumed.output
        assert "Settle the unknown items with `notifier reconcile --manual blast`." in (
            resumed.output
        )
        unknown = [item for item in ws.ledger.items("blast") if item.state == "unknown"]
        assert {item.idempotency_key for item in unknown} == held, "never sent again"

        # The advice, followed: each unknown item marked from what the receiver holds.
        for item in unknown:
            mark = "sent" if receiver.commits.get(item.idempotency_key) else "not-sent"
            marked = ws.invoke("reconcile", "--manual", "blast", "--item", item.item_id,
                               "--mark", mark, "--evidence", "the receiver's log")  # fmt: skip
            assert marked.exit_code in (0, 3), marked.output

    assert receiver.commits == dict.fromkeys(ws.ledger.keys(run_id="blast"), 1)
    assert ws.ledger.state_counts("blast") == {"sent": rows}
