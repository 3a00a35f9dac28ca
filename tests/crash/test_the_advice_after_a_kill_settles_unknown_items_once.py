"""After a kill -9 with requests under way on a channel that can neither be asked about a key
nor trusted to deduplicate one, `resume` leaves those items unknown and its advice names
`notifier reconcile --manual`. Following it (a mark per item, from what the receiver holds)
and resuming delivers every row exactly once. Real processes, both stores, N = 1 and 8."""

from __future__ import annotations

import signal

import pytest

from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows, wait_for

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(180)]


@pytest.mark.parametrize("n", [1, 8])
def test_the_manual_marks_the_advice_names_settle_a_killed_run_and_send_nothing_twice(
    ws: Workspace, n: int
) -> None:
    # A receiver that commits every POST it gets, after 200 ms, and dedupes nothing. Nine
    # rounds of n sends: the kill comes long before the last (the check after the wait says
    # so if it ever does not).
    rows = 8 * n + 8
    with Sandbox(faults=Faults(latency_ms=200, idempotent=False)) as box:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{box.notifications_url}"\n'
            "idempotent = false\n"
        )
        ws.write_csv("batch.csv", make_rows(rows))
        sender = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n),
                          "--run-id", "blast")  # fmt: skip
        try:
            wait_for(lambda: box.stats()["totals"]["requests"] >= n or sender.poll() is not None,
                     f"{n} request(s) under way")  # fmt: skip
            assert sender.poll() is None, "the send ended before the kill"
            sender.send_signal(signal.SIGKILL)
        finally:
            sender.kill()
            sender.communicate(timeout=30)
        # The receiver commits what reached it even though nobody waits for the answer.
        wait_for(
            lambda: box.stats()["totals"]["commits"] == box.stats()["totals"]["requests"],
            "every request that reached the receiver committed",
        )
        committed = {key for key, seen in box.stats()["keys"].items() if seen["commits"]}

        resumed = ws.invoke("resume", "blast", "--concurrency", str(n))
        unknown = [item for item in ws.ledger.items("blast") if item.state == "unknown"]
        assert unknown, "a request under way at the kill leaves its item unknown"
        assert resumed.exit_code == 3, resumed.output
        assert "Settle the unknown items with `notifier reconcile --manual blast`." in (
            resumed.output
        )

        # The advice, followed: each unknown item marked from what the receiver holds; one
        # marked not sent (its request never reached the receiver) waits for a resume.
        for item in unknown:
            mark = "sent" if item.idempotency_key in committed else "not-sent"
            evidence = "the receiver's deliveries"
            marked = ws.invoke("reconcile", "--manual", "blast", "--item", item.item_id,
                               "--mark", mark, "--evidence", evidence)  # fmt: skip
            assert marked.exit_code in (0, 3), marked.output
        if ws.ledger.run("blast").state != "completed":
            again = ws.invoke("resume", "blast", "--concurrency", str(n))
            assert again.exit_code == 0, again.output

        keys = ws.ledger.keys(run_id="blast")
        assert {key: seen["commits"] for key, seen in box.stats()["keys"].items()} == {
            key: 1 for key in keys
        }
    assert ws.ledger.state_counts("blast") == {"sent": rows}
