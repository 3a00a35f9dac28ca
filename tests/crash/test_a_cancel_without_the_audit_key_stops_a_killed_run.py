"""An operator without the audit key cancels a keyed run whose worker was killed with
SIGKILL mid-send at concurrency 8: the cancel is not lost for want of the key. Its flag is
set and no event is written (the chain stays whole); it exits 4 naming the run's key id and
the fix; nothing new is sent by anyone after it, `resume` included; and following the advice
it printed (the same cancel with the key) closes the run, whose chain and replay then verify
keyed. Both stores; the worker is a real process, the commands after it run in-process."""

from __future__ import annotations

import json
import signal

import pytest

from notifier.domain.chain import KEY_ENV, key_id
from notifier.domain.verify import AuditVerdict
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows, wait_for
from ..support.audited import KEY, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(180)]
ROWS = 200


def committed(box: Sandbox) -> set[str]:
    return {k for k, v in box.stats()["keys"].items() if v["commits"]}


def test_a_cancel_without_the_key_after_kill_9_stops_the_run_and_its_advice_closes_it(
    ws: Workspace,
) -> None:
    with Sandbox(faults=Faults(latency_ms=20)) as box:
        (ws.path / "notifier.toml").write_text(
            "[channels.hooks]\n"
            'type = "webhook"\n'
            f'url = "{box.notifications_url}"\n'
            f'status_url = "{box.url}/notifications/{{key}}"\n'
            "idempotent = true\n"
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        worker = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", "8",
                          "--run-id", "keyed", env={KEY_ENV: KEY})  # fmt: skip
        try:
            wait_for(lambda: ws.sent_so_far() >= 20 or worker.poll() is not None, "20 items sent")
            assert worker.poll() is None, "the run ended before the kill"
            assert ws.store == "sqlite" or ws.sessions_of(worker.pid) > 0, (
                f"no session named notifier[{worker.pid}] (PGAPPNAME set?)"
            )
            worker.send_signal(signal.SIGKILL)
        finally:
            worker.kill()
            worker.communicate(timeout=30)
        # A transaction the worker had sent whole may still commit after its death.
        ws.wait_sessions_ended(worker.pid)
        events = len(ws.ledger.events(run_id="keyed"))
        delivered = committed(box)

        keyless = ws.invoke("cancel", "keyed", "--report", env={KEY_ENV: ""})
        assert keyless.exit_code == 4, keyless.output
        assert key_id(KEY.encode()) in keyless.output and KEY_ENV in keyless.output
        assert "Traceback" not in keyless.output
        assert ws.ledger.run("keyed").cancel_requested_at is not None
        assert len(ws.ledger.events(run_id="keyed")) == events

        resumed = ws.invoke("resume", "keyed", env={KEY_ENV: KEY})
        assert resumed.exit_code == 3, resumed.output  # closed as cancelled, not sent on
        assert ws.ledger.run("keyed").state == "cancelled"
        keyed = ws.invoke("cancel", "keyed", "--report", "--format", "json", env={KEY_ENV: KEY})
        assert keyed.exit_code == 3, keyed.output  # some will never be sent
        report = json.loads(keyed.stdout)
        assert ws.ledger.run("keyed").state == "cancelled"
        # Nothing new went out after the kill: what was delivered then is what is delivered
        # now, give or take the requests the kill cut off in flight (at most 8), each settled
        # by query and never posted again.
        assert delivered <= committed(box)
        assert len(committed(box) - delivered) <= 8
        sent_keys = {i["idempotency_key"] for i in report["items"] if i["state"] == "sent"}
        assert sent_keys == committed(box)
        assert all(v["commits"] == 1 for v in box.stats()["keys"].values())
    found = verdict(ws, "keyed")
    assert (found.verdict, found.findings) == (AuditVerdict.KEYED, ())
