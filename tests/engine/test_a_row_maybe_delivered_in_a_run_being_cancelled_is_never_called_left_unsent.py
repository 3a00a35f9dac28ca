"""A run whose cancel was asked for and not finished (a cancel without the audit key refused
after a kill -9) sends nothing more, yet one of its pending rows may have been delivered: its
500 came after the receiver committed it (an idempotent channel: it waited to retry, maybe
delivered). The JSON calls it `maybe_delivered`; `status` and `report` say so in its row,
never "left unsent" alone. Both stores."""

from __future__ import annotations

import json

import pytest

from notifier.domain.chain import KEY_ENV

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.audited import KEY
from ..support.crashed import crash_send

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]

SLOW = "[retry]\nmax_attempts = 5\nbackoff_base = 600\nbackoff_max = 600\n"


def test_a_maybe_delivered_row_of_a_run_being_cancelled_is_never_labelled_just_left_unsent(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    receiver = Receiver(answer=lambda item_id, n: 500 if item_id == "u2" else None,
                        commit_first=True)  # fmt: skip
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=False, timeout=1, retry=SLOW)
        )
        ws.write_csv("batch.csv", make_rows(3))
        crash_send("after-intent:3", db=ws.db, channel="hooks", run_id="r1", concurrency=1)
        assert receiver.deliveries() == {"u1": 1, "u2": 1}  # u2 committed, answered 500
        keyless = ws.invoke("cancel", "r1", env={KEY_ENV: ""})
        assert keyless.exit_code == 4, keyless.output  # the flag is set, the run not closed
        assert ws.ledger.run("r1").cancel_requested_at is not None
        reported = json.loads(ws.invoke("report", "r1", "--format", "json").stdout)
        status = ws.invoke("status", "r1").output
        report = ws.invoke("report", "r1").output
    kinds = {i["id"]: (i["state"], i["pending_kind"]) for i in reported["items"]}
    assert kinds["u2"] == ("pending", "maybe_delivered"), kinds
    for name, text in {"status": status, "report": report}.items():
        rows = [ln for ln in text.splitlines() if " u2 " in f" {ln} " and "pending" in ln]
        assert rows, (name, text)
        for row in rows:  # the receiver holds u2: never "left unsent" alone
            assert "maybe delivered" in row and "left unsent" not in row, (name, row)
