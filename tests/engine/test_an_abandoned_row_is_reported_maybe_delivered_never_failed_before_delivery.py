"""An item an operator abandoned (`reconcile --manual --mark abandon`: nobody can tell, so
maybe delivered) stays `failed` in the ledger, as the contract has it, but every report says
it may have been delivered: `report`, `status` and `cancel --report`, in JSON (the
`failed_detail` split beside `pending_detail`, each item's `failed_kind`), CSV and the tables.
`failed` alone would put a recipient who may have the message among those who never will,
beside a row the receiver refused. The whole engine in-process against a scripted receiver
(the abandoned row really was delivered), at N = 1 and at N = 8 with items claimed ahead,
on both stores."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import (
    DELIVER,
    LOST_AFTER_COMMIT,
    REJECT,
    Channels,
    Response,
    ScriptedChannel,
)
from notifier.config import Config, RetrySettings
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent
from notifier.domain.state_machine import RunState
from notifier.engine.runner import RunResult

from ..conftest import Workspace, make_rows
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
CONCURRENCY = pytest.mark.parametrize("n", [1, 8])
ROWS = 40  # more than N + 3N: items are claimed ahead at N = 8
# The one line every command prints about a run's items, for these: u3 abandoned, u5 refused.
ONE_LINE = "2 failed (1 abandoned, maybe delivered)"
LOST = ("u3", "u4")  # delivered, the answer lost, and no status query can tell
REFUSED = "u5"  # a 400: never delivered
WEBHOOK = {
    "type": "webhook",
    "url": "http://127.0.0.1:9/notifications",  # never dialled: the script answers
    "status_url": "http://127.0.0.1:9/notifications/{key}",
    "idempotent": False,
    "timeout": 1,
    "query_delay": 0,
}


class Unsure(ScriptedChannel):
    """A receiver that can be asked (so items are claimed ahead), whose status endpoint
    cannot say anything about the keys of the LOST rows."""

    def __init__(self) -> None:
        super().__init__("hooks", self.answer, idempotent=False, queryable=True)
        self.unsure: set[str] = set()

    def answer(self, intent: Intent, tries: int) -> Response:
        if intent.item_id in LOST:
            self.unsure.add(intent.idempotency_key)
            return LOST_AFTER_COMMIT
        return REJECT if intent.item_id == REFUSED else DELIVER

    def query(self, key: str) -> Receipt | None:
        if key in self.unsure:
            raise ChannelError(ErrorKind.UNCERTAIN, "hooks: status endpoint timed out")
        return super().query(key)


def _run_with_u3_abandoned(ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch) -> Unsure:
    """The batch sent: u3 and u4 unknown (both delivered), u5 refused, the rest sent; then u3
    abandoned by hand, u4 left unknown, so the run is still open for a cancel."""
    (ws.path / "notifier.toml").write_text(
        "[channels.hooks]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in WEBHOOK.items())
    )
    ws.write_csv("batch.csv", make_rows(ROWS))
    channel = Unsure()
    config = Config(
        path=None,
        channels={"hooks": dict(WEBHOOK)},
        retry=RetrySettings(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.05),
    )
    notifier = Notifier.open(ws.db, config=config, channels=Channels(hooks=channel))
    result = notifier.send(Path("batch.csv"), channel="hooks", concurrency=n)
    assert isinstance(result, RunResult), result
    assert result.state is RunState.PAUSED, result
    assert set(channel.deliveries) >= channel.unsure and channel.twice() == {}
    states = {i.item_id: i.state for i in ws.ledger.items()}
    assert [i for i, s in states.items() if s == "unknown"] == list(LOST), states
    assert states[REFUSED] == "failed", states
    past_every_window(monkeypatch)  # the receiver's window has passed
    abandoned = ws.invoke("reconcile", "--manual", "--item", "u3", "--mark", "abandon",
                          "--evidence", "the receiver cannot tell")  # fmt: skip
    assert abandoned.exit_code == 3, abandoned.output
    assert ONE_LINE in abandoned.output, abandoned.output  # the mark's own summary says so
    return channel


def _item(report: dict[str, Any], item_id: str) -> dict[str, Any]:
    return next(i for i in report["items"] if i["id"] == item_id)


def _says_u3_maybe_delivered(report: dict[str, Any], what: str) -> None:
    assert report["counts"]["failed"] == 2, (what, report["counts"])
    assert report["failed_detail"] == {"not_delivered": 1, "abandoned": 1}, what
    assert _item(report, "u3")["state"] == "failed", what  # the contract's state is kept
    assert _item(report, "u3")["failed_kind"] == "abandoned", what
    assert _item(report, REFUSED)["failed_kind"] == "not_delivered", what
    assert _item(report, "u1")["failed_kind"] is None, what


def _table_says_u3_maybe_delivered(table: str, what: str) -> None:
    assert "failed: 1 not delivered, 1 abandoned by an operator (maybe delivered)" in table, (
        what,
        table,
    )
    # The lines that list u3 (its recipient): the items needing attention and every item.
    u3 = [line for line in table.splitlines() if "user3@example.com" in line]
    assert u3 and all("failed (abandoned, maybe delivered)" in line for line in u3), (what, u3)
    u5 = [line for line in table.splitlines() if "user5@example.com" in line]
    assert u5 and not any("maybe delivered" in line for line in u5), (what, u5)


@CONCURRENCY
def test_every_report_says_an_abandoned_row_may_have_been_delivered(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_with_u3_abandoned(ws, n, monkeypatch)
    reported = json.loads(ws.invoke("report", "--json").stdout)
    _says_u3_maybe_delivered(reported, "report --json")
    _says_u3_maybe_delivered(json.loads(ws.invoke("status", "--json").stdout), "status --json")
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(ws.invoke("report", "--format",
                                                                      "csv").stdout))}  # fmt: skip
    assert rows["u3"]["failed_kind"] == "abandoned" and rows["u3"]["state"] == "failed"
    assert rows[REFUSED]["failed_kind"] == "not_delivered"
    _table_says_u3_maybe_delivered(ws.invoke("report").output, "report")
    _table_says_u3_maybe_delivered(ws.invoke("status").output, "status")

    cancelled = ws.invoke("cancel", "--report", "--json", "--wait", "5")
    assert cancelled.exit_code == 3, cancelled.output
    after = json.loads(cancelled.stdout)
    assert after["state"] == "cancelled"
    _says_u3_maybe_delivered(after, "cancel --json")
    assert _item(after, "u4")["state"] == "unknown"  # no query could tell: maybe delivered
    _table_says_u3_maybe_delivered(ws.invoke("report").output, "report after the cancel")


@CONCURRENCY
def test_cancel_report_table_says_an_abandoned_row_may_have_been_delivered(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_with_u3_abandoned(ws, n, monkeypatch)
    cancelled = ws.invoke("cancel", "--report", "--wait", "5")
    assert cancelled.exit_code == 3, cancelled.output
    _table_says_u3_maybe_delivered(cancelled.output, "cancel --report")


@CONCURRENCY
def test_a_plain_cancel_says_an_abandoned_row_may_have_been_delivered(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --report, the cancel's one line is all the operator sees: its failed rows
    name the abandoned one as maybe delivered."""
    _run_with_u3_abandoned(ws, n, monkeypatch)
    cancelled = ws.invoke("cancel", "--wait", "5")
    assert cancelled.exit_code == 3, cancelled.output
    assert ONE_LINE in cancelled.output, cancelled.output


@CONCURRENCY
def test_resume_and_runs_say_an_abandoned_row_may_have_been_delivered(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resume` prints the run's one line as it starts and as it stops, and `runs` lists
    every run's counts: each names the abandoned row among the failed, never a bare
    "2 failed" beside a refused one."""
    _run_with_u3_abandoned(ws, n, monkeypatch)
    resumed = ws.invoke("resume")
    lines = [line for line in resumed.output.splitlines() if " sent, " in line]
    assert len(lines) >= 2 and all(ONE_LINE in line for line in lines), resumed.output

    listed = json.loads(ws.invoke("runs", "--json").stdout)["runs"]
    assert listed[0]["counts"]["failed"] == 2
    assert listed[0]["failed_detail"] == {"not_delivered": 1, "abandoned": 1}, listed[0]
    table = ws.invoke("runs").output
    assert "2 (1 abandoned)" in table, table
