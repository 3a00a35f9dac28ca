"""Apprise end to end: `json://` notifications into the sandbox in --no-idempotent mode,
where a duplicate would show up as a second delivery."""

from __future__ import annotations

import json

from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_send


def test_apprise_sends_each_row_once_and_a_crash_leaves_unknown_not_a_duplicate(
    ws: Workspace,
) -> None:
    """10 rows through Apprise's json:// scheme: a crash after item 5 left makes it unknown
    on resume, so the sandbox holds exactly 10 deliveries, titles and bodies intact."""
    with Sandbox(faults=Faults(idempotent=False)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            "[channels.alerts]\n"
            'type = "apprise"\n'
            f'urls = ["json://127.0.0.1:{sandbox.url.rsplit(":", 1)[1]}/notifications"]\n'
        )
        ws.write_csv("batch.csv", make_rows(10))
        crash_send("after-send:5", db=ws.db, channel="alerts")
        resumed = ws.invoke("resume")
        assert resumed.exit_code == 3, resumed.output
        deliveries = sandbox.deliveries()
    assert len(deliveries) == 10
    assert sorted(d["body"]["title"] for d in deliveries) == sorted(
        f"Hello {i}" for i in range(1, 11)
    )
    assert {d["body"]["message"] for d in deliveries} == {f"Body of {i}" for i in range(1, 11)}
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["counts"]["sent"] == 9 and report["counts"]["unknown"] == 1
    assert next(i for i in report["items"] if i["state"] == "unknown")["seq"] == 5
