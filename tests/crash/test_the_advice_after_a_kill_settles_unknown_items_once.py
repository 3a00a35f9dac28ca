"""After a kill -9 with requests under way on a channel that can neither be asked about a key
nor trusted to deduplicate one, `resume` leaves those items unknown and its advice names
`notifier reconcile --manual`. Following it (a mark per item, from what the receiver holds)
and resuming delivers every row exactly once. Real processes, both stores, N = 1 and 8; the
kill lands at a chosen point (the sender stopped there with NOTIFIER_FREEZE_AT, then killed):
an answer received but not recorded (marked sent), and an item claimed whose request never
left (marked not-sent, then sent by the resume). A not-sent mark is refused until the
receiver's window has passed (the receiver may still commit a request until then); the
operator looks again after it, and the marks go through."""

from __future__ import annotations

import pytest

from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows, wait_for
from ..support.waits import past_every_window
from ..support.workspace import stopped

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(180)]


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize(("point", "mark"), [("after-send", "sent"), ("after-intent", "not-sent")])
def test_the_manual_marks_the_advice_names_settle_a_killed_run_and_send_nothing_twice(
    ws: Workspace, n: int, point: str, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # after-send:1 - item 1 answered (committed at the receiver), not recorded;
    # after-intent:n+1 - item n+1 claimed in the ledger, its request never handed out.
    seq = 1 if point == "after-send" else n + 1
    rows = 8 * n + 8
    with Sandbox(faults=Faults(latency_ms=200, idempotent=False)) as box:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{box.notifications_url}"\n'
            "idempotent = false\n"
        )
        ws.write_csv("batch.csv", make_rows(rows))
        freeze = {"NOTIFIER_FREEZE_AT": f"{point}:{seq}"}
        sender = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n),
                          "--run-id", "blast", env=freeze)  # fmt: skip
        try:
            wait_for(lambda: sender.poll() is not None or stopped(sender.pid),
                     f"the sender stopped {point} item {seq}")  # fmt: skip
            assert sender.poll() is None, sender.communicate()
        finally:
            sender.kill()  # SIGKILL: nothing after the point it froze at runs
            sender.communicate(timeout=30)
        # Every request the dead process sent is handled (committed) before the receiver is
        # read, including bytes still in a socket at the kill.
        box.quiesce()
        committed = {key for key, seen in box.stats()["keys"].items() if seen["commits"]}

        resumed = ws.invoke("resume", "blast", "--concurrency", str(n))
        unknown = [item for item in ws.ledger.items("blast") if item.state == "unknown"]
        assert resumed.exit_code == 3, resumed.output
        assert "Settle the unknown items with `notifier reconcile --manual blast` from " in (
            resumed.output
        )
        assert "when the receiver can no longer commit them" in resumed.output
        marks = {item.seq: "sent" if item.idempotency_key in committed else "not-sent"
                 for item in unknown}  # fmt: skip
        assert marks.get(seq) == mark, marks  # the item the kill caught is unknown, as expected
        evidence = "the receiver's deliveries"
        if "not-sent" in marks.values():  # followed at once: inside the receiver's window
            first = next(item for item in unknown if marks[item.seq] == "not-sent")
            early = ws.invoke("reconcile", "--manual", "blast", "--item", first.item_id,
                              "--mark", "not-sent", "--evidence", evidence)  # fmt: skip
            assert early.exit_code == 4, early.output
            assert "may still commit" in early.output, early.output
        past_every_window(monkeypatch)  # the operator looks again once it has passed
        for item in unknown:
            marked = ws.invoke("reconcile", "--manual", "blast", "--item", item.item_id,
                               "--mark", marks[item.seq], "--evidence", evidence)  # fmt: skip
            assert marked.exit_code in (0, 3), marked.output
        if "not-sent" in marks.values():
            again = ws.invoke("resume", "blast", "--concurrency", str(n))
            assert again.exit_code == 0, again.output
        assert ws.ledger.run("blast").state == "completed"

        keys = ws.ledger.keys(run_id="blast")
        assert {key: seen["commits"] for key, seen in box.stats()["keys"].items()} == {
            key: 1 for key in keys
        }
    assert ws.ledger.state_counts("blast") == {"sent": rows}
