"""`reconcile` (by query or `--manual`) of a run another live process still holds is
refused, exit 4 (the contract's "lease held by a live worker"), recording nothing. While a
cancel of that run is under way (asked for, the worker finishing the requests it sent),
the refusal said "run … was cancelled (by pid …) before this process could start sending;
nothing was sent by it", exit 3: the run was not cancelled yet, the pid was the worker's,
and the operator's mark, not recorded, was not said to be lost. The refusal must say that
nothing was recorded and how to go on; followed once the holder let go, the mark is
recorded. Both stores."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifier.domain import clock
from notifier.engine.membership import SoleLease
from notifier.store import Store

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

MARK = ("reconcile", "r1", "--manual", "--item", "u2", "--mark", "sent", "--evidence", "inbox")


def test_a_reconcile_refused_during_a_cancel_says_nothing_was_recorded(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("b.csv", make_rows(3))
        sent = ws.invoke("send", "b.csv", "--channel", "hooks", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u2").state == "unknown"
        # The receiver's window for u2 is long past when the operator looks.
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(hours=2))
        # A live process holds the run (a worker finishing what it sent), and a cancel of
        # the run has been asked for.
        store = Store.open(ws.db)
        try:
            holder = SoleLease(store, "r1", 30.0)
            try:
                assert store.ledger.request_cancel("r1")
                for command in (MARK, ("reconcile", "r1")):
                    refused = ws.invoke(*command)
                    assert refused.exit_code == 4, (command, refused.output)
                    assert "was cancelled" not in refused.output, refused.output
                    assert "nothing was recorded" in refused.output, refused.output
                    assert "run the same command again" in refused.output, refused.output
                    assert "`notifier resume" not in refused.output, refused.output
                assert ws.ledger.item("u2").state == "unknown"
            finally:
                holder.release()
        finally:
            store.close()
        # The holder gone, the same command again records the mark.
        again = ws.invoke(*MARK)
        assert again.exit_code in (0, 3), again.output
    assert ws.ledger.item("u2").state == "sent"
    assert receiver.deliveries() == {"u1": 1, "u3": 1}  # u2's 500 never committed
