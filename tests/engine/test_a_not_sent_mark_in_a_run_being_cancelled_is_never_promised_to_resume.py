"""Adversarial review: a run whose cancel was asked for but not finished (a cancel without
the audit key refused with exit 4 after the worker was killed: its flag stays set) is
closed as cancelled by the next `resume`, which sends nothing more. An item marked not-sent
by hand in that run must not be promised to `resume` ("it will be sent with the same key on
resume"): followed, that advice sends nothing, and the row reaches nobody."""

from __future__ import annotations

import pytest

from notifier.domain.chain import KEY_ENV

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.audited import KEY
from ..support.crashed import crash_send
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


def test_a_not_sent_mark_after_a_refused_cancel_is_not_promised_to_resume(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("batch.csv", make_rows(3))
        # Killed once u2's attempt was recorded, before its request left.
        crash_send("after-intent:2", db=ws.db, channel="hooks", run_id="r1")
        assert receiver.deliveries() == {"u1": 1}
        keyless = ws.invoke("cancel", "r1", env={KEY_ENV: ""})
        assert keyless.exit_code == 4, keyless.output  # the flag is set, the run not closed
        assert ws.ledger.run("r1").cancel_requested_at is not None
        settled = ws.invoke("reconcile", "r1")  # the channel cannot be asked: unknown
        assert ws.ledger.item("u2").state == "unknown", settled.output
        past_every_window(monkeypatch)
        marked = ws.invoke("reconcile", "r1", "--manual", "--item", "u2",
                           "--mark", "not-sent", "--evidence", "never reached the gateway")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        resumed = ws.invoke("resume", "r1")
        # What resume did with the run and with u2.
        closed = ws.ledger.run("r1").state
        u2_delivered = receiver.deliveries().get("u2", 0)
    promised = "will be sent with the same key on resume" in marked.output
    assert not (promised and closed == "cancelled" and u2_delivered == 0), (
        f"the mark said: {marked.output!r}; then `resume` said: {resumed.output!r} and "
        f"left the run {closed}, u2 delivered {u2_delivered} time(s)"
    )
