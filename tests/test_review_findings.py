"""Defects found in review of the 93685c8..main merge, each pinned through the real CLI."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from notifier.store.postgres import POSTGRES

from .conftest import Workspace, make_rows, smtp_server
from .receiver import Receiver, receiving, webhook_config
from .test_send_windows import window_from
from .test_suppression import Relay, report

pytestmark = pytest.mark.both_stores


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("n", [1, 8])
def test_json_log_never_names_a_recipient_rejected_at_rcpt(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """Without --log-bodies no JSON log line carries a recipient, even one a relay echoes."""
    relay.rcpt_answers["user4@example.com"] = "550 5.1.1 <user4@example.com>: no such user"
    ws.write_csv("batch.csv", make_rows(6))
    done = ws.run(
        "send", "batch.csv", "--channel", "mail", "--concurrency", str(n),
        "--log-format", "json",
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert any(e.get("attempt_outcome") == "permanent" for e in lines), lines
    assert "user4@example.com" not in done.stderr


@pytest.fixture
def receiver(ws: Workspace) -> Iterator[Receiver]:
    with receiving(Receiver()) as running:
        yield running


def test_a_window_closing_mid_run_does_not_pause_the_items_of_other_channels(
    ws: Workspace, receiver: Receiver
) -> None:
    """Items of a channel without a window are sent even after another channel's closed."""
    now = datetime.now(UTC).replace(microsecond=0)
    soon = window_from(now - timedelta(seconds=1), 3, "UTC")  # closes 2 s from now
    later = window_from(now + timedelta(hours=1), 60, "UTC")  # beyond --max-wait
    config = webhook_config(receiver, idempotent=True, status=True)
    for name, window in (("soon", soon), ("later", later)):
        config += (
            f'\n[channels.{name}]\ntype = "webhook"\nurl = "{receiver.url}/notifications"\n'
            f'idempotent = true\nwindow = "{window}"\n'
        )
    (ws.path / "notifier.toml").write_text(config)
    rows = [["id", "to", "subject", "body", "channel"]]
    channels = ["soon"] * 8 + ["hooks"] * 6 + ["later"]
    for i, channel in enumerate(channels, start=1):
        rows.append([f"u{i}", f"user{i}@example.com", f"Hello {i}", f"Body {i}", channel])
    batch = ws.write_csv("b.csv", rows)
    result = ws.run(
        "send", str(batch), "--rate", "2", "--concurrency", "1", "--max-wait", "5",
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr  # `later` waits: a pause
    sent = ws.query("SELECT channel, COUNT(*) FROM items WHERE state = 'sent' GROUP BY channel")
    assert dict(sent).get("hooks") == 6, (sent, result.stdout + result.stderr)


def test_a_maybe_delivered_item_is_not_called_suppressed_never_sent(
    ws: Workspace, receiver: Receiver
) -> None:
    """An item whose timed-out request the receiver committed, then suppressed while the run
    is paused, is not reported `suppressed` (never sent) with exit 0 on resume."""

    def answer(item_id: str, n: int) -> int | None:
        if item_id == "u3" and n == 1:
            time.sleep(1.5)  # past the channel's 1 s timeout: the client sees no answer
        return None  # then committed: the request was delivered

    receiver.answer = answer
    (ws.path / "notifier.toml").write_text(
        webhook_config(receiver, idempotent=True, status=False, timeout=1)
    )
    ws.write_csv("batch.csv", make_rows(5))
    worker = ws.popen("send", "batch.csv", "--channel", "hooks", "--concurrency", "1")
    try:
        receiver.wait_for(lambda r: r.posts("u3") >= 1)
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=60) == 130, worker.stderr.read() if worker.stderr else ""
    finally:
        worker.kill()
        worker.wait()
    receiver.wait_for(lambda r: len(r.commits) >= 3)  # u3's request was committed
    ((outcome,),) = ws.query("SELECT outcome FROM attempts WHERE seq = 3")
    assert outcome == "uncertain"
    assert ws.invoke("suppress", "add", "user3@example.com").exit_code == 0
    resumed = ws.run("resume")
    (state,) = [i["state"] for i in report(ws)["items"] if i["id"] == "u3"]
    assert not (state == "suppressed" and resumed.returncode == 0), resumed.stdout


def test_the_claims_suppression_probe_uses_the_lists_primary_key(ws: Workspace) -> None:
    """On PostgreSQL each claimed row asks the list by its primary key, not by a full scan."""
    if not ws.url:
        pytest.skip("PostgreSQL: SQLite's LOWER(TRIM()) needs no collation")
    listed = ws.write_csv(
        "bounced.csv", [["address"], *([f"bounced{i}@example.net"] for i in range(20_000))]
    )
    imported = ws.invoke("suppress", "import", str(listed))
    assert imported.exit_code == 0, imported.output
    with psycopg.connect(ws.url, autocommit=True) as pg:
        pg.execute("ANALYZE suppressions")
        probe = POSTGRES.address_of.format("'User1@Example.com'")
        plan = "\n".join(
            row[0]
            for row in pg.execute(
                f"EXPLAIN SELECT EXISTS (SELECT 1 FROM suppressions s WHERE s.address = {probe})"
            )
        )
    assert "suppressions_pkey" in plan, plan
