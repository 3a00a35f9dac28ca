"""Two processes on one file: the loser of two simultaneous sends is told who sends and what to
run, and a send killed (-9) then cancelled never takes an early 404 as never delivered when
the file is sent again."""

from __future__ import annotations

import threading

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores


def test_the_loser_of_two_simultaneous_sends_is_told_who_sends_and_what_to_run(
    ws: Workspace,
) -> None:
    """A second `send` of a file whose rows another process is sending right now is
    refused (exit 2) naming that process and `notifier status`, not `resume` (which its
    lease would refuse); the first send then finishes every row once."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True, timeout=30)
        )
        ws.write_csv("b.csv", make_rows(4))
        first = ws.popen("send", "b.csv", "--channel", "hooks")
        try:
            receiver.wait_for(lambda r: len(r.arrivals) >= 1)  # the winner is sending
            # The loser in-process: what it says names the other process, still sending.
            loser = ws.invoke("send", "b.csv", "--channel", "hooks")
            hold.set()
            out, err = first.communicate(timeout=60)
        finally:
            hold.set()
            if first.poll() is None:
                first.kill()
    assert loser.exit_code == 2, loser.output
    assert f"pid {first.pid}" in loser.stderr and "notifier status" in loser.stderr
    assert "notifier resume" not in loser.stderr
    assert first.returncode == 0, out + err
    assert sorted(receiver.commits.values()) == [1, 1, 1, 1]


def test_a_cancel_after_a_kill_never_takes_an_early_404_as_never_delivered(
    ws: Workspace,
) -> None:
    """Killed while its request was at an idempotent receiver that commits it only later
    (after `cancel` asked: a 404 that is early): `cancel` reports the item as maybe delivered
    (unknown), not as never sent, and sending the file again is refused until it is settled,
    so no second delivery."""
    # The commit waits for this, not for a time: on a loaded machine `cancel` may start
    # seconds after the kill, and must still find the request not yet committed.
    committed_later = threading.Event()
    receiver = Receiver(hold=committed_later)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True, timeout=10, query_delay=5)
        )
        ws.write_csv("b.csv", make_rows(1))
        sender = ws.popen("send", "b.csv", "--channel", "hooks")
        try:
            receiver.wait_for(lambda r: len(r.arrivals) == 1)
        finally:
            sender.kill()
            sender.communicate()
        cancelled = ws.invoke("cancel", "--wait", "5")
        committed_later.set()
        assert cancelled.exit_code == 3, cancelled.output
        assert list(ws.ledger.states().values()) == ["unknown"]
        receiver.wait_for(lambda r: len(r.commits) == 1)
        again = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert again.exit_code == 2, again.output
    assert len(receiver.commits) == 1, receiver.commits
