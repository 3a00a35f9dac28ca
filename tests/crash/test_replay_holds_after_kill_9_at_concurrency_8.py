"""A real `send --concurrency 8` against a provider with faults (latency, dropped answers,
500s), killed with SIGKILL mid-run: what it committed replays to its rows under the key, and
so does the run once `resume` has finished it. Both stores."""

from __future__ import annotations

import signal

import pytest

from notifier.domain.chain import KEY_ENV
from notifier.domain.verify import AuditVerdict
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows, wait_for
from ..support.audited import KEY, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(240)]
ROWS = 150


def test_a_run_killed_at_concurrency_8_with_faults_replays_before_and_after_resume(
    ws: Workspace,
) -> None:
    key = {KEY_ENV: KEY}
    with Sandbox(faults=Faults(seed=3, latency_ms=10, drop_rate=0.05, fail_rate=0.05)) as box:
        (ws.path / "notifier.toml").write_text(
            "[channels.hooks]\n"
            'type = "webhook"\n'
            f'url = "{box.notifications_url}"\n'
            f'status_url = "{box.url}/notifications/{{key}}"\n'
            "idempotent = true\n"
            "[retry]\nmax_attempts = 20\nbackoff_base = 0.01\nbackoff_max = 0.05\n"
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        worker = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", "8",
                          "--run-id", "chaos", env=key)  # fmt: skip
        try:
            wait_for(lambda: ws.sent_so_far() >= 30 or worker.poll() is not None, "30 items sent")
            assert worker.poll() is None, "the run ended before the kill"
            worker.send_signal(signal.SIGKILL)
        finally:
            worker.kill()
            worker.communicate(timeout=30)
        killed = verdict(ws, "chaos")
        assert (killed.verdict, killed.findings) == (AuditVerdict.KEYED, ())
        assert ws.ledger.run("chaos").state == "running"
        resumed = ws.run("resume", "chaos", env=key)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    finished = verdict(ws, "chaos")
    assert (finished.verdict, finished.findings) == (AuditVerdict.KEYED, ())
    assert ws.ledger.state_counts() == {"sent": ROWS}
