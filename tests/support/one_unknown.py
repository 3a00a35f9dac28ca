"""A run left with one item whose outcome nobody knows, for the tests of what an operator
does next (a mark, a cancel, a report) and of what the tool then says and sends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..receiver import Receiver, receiving, webhook_config
from .workspace import Workspace, make_rows


@contextmanager
def a_run_with_u2_unknown(ws: Workspace, run_id: str = "r1") -> Iterator[Receiver]:
    """Run `run_id` of three rows (batch.csv, channel `hooks`) sent to a receiver that can
    neither dedupe nor be asked, whose first answer to u2 was a 500 with nothing committed:
    u1 and u3 sent, u2 unknown. The receiver answers for as long as the block runs."""
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("batch.csv", make_rows(3))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", run_id)
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u2", run_id).state == "unknown"
        yield receiver
