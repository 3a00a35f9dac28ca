"""A `send` running in a PID namespace of its own with this host's name (a container on the
host's network: a Kubernetes pod with hostNetwork, `docker run --network host`) is alive,
though its pid names another process here, or none. `cancel` must wait for it, never take it
for dead and fence it out while it may still be sending: the sender sees the cancel and closes
the run itself, and every notification it wrote is recorded sent. Real processes: the sender
under `unshare --pid` (root)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import Workspace, make_rows, wait_for
from .test_frozen_worker import UNSHARE

pytestmark = pytest.mark.both_stores


def _pid_namespaces_work() -> bool:
    try:
        probe = subprocess.run(
            [UNSHARE, "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.skipif(not _pid_namespaces_work(), reason="needs `unshare --pid` (root)")
@pytest.mark.timeout(90)
def test_a_cancel_waits_for_a_live_sender_in_another_pid_namespace(ws: Workspace) -> None:
    """The sender (N = 8, --rate 5: still sending when the cancel comes) is PID 1 of its own
    namespace. `cancel --wait 60` waits for it: it exits 0 or 3, never 4 ("another process
    took over this run"), and no notification it wrote is recorded anything but sent."""
    ws.write_csv("batch.csv", make_rows(200))
    command = [sys.executable, "-m", "notifier", "--db", str(ws.db), "send", "batch.csv",
               "--run-id", "c1", "--concurrency", "8", "--rate", "5"]  # fmt: skip
    sender = subprocess.Popen(
        [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child", *command],
        cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: len(ws.outbox_documents()) >= 3, "the sender is sending")
        cancelled = ws.invoke("cancel", "c1", "--wait", "60")
        out, _ = sender.communicate(timeout=60)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
    assert sender.returncode in (0, 3), out
    assert "took over" not in out, out
    assert cancelled.exit_code in (0, 3), cancelled.output
    assert ws.ledger.run().state == "cancelled"
    states = {item.idempotency_key: item.state for item in ws.ledger.items()}
    written = {document["idempotency_key"] for document in ws.outbox_documents()}
    assert {states[key] for key in written} == {"sent"}, "a notification written, not sent"
