"""A refusal answers its own request only. An idempotent webhook's first request of each item
is committed by the receiver, but its answer never comes back (the client's timeout: uncertain,
so the item is retried under the same key); the retry is refused (401), the endpoint is gone
(410), or the key is answered as a conflict (422: a receiver may answer so for a key it took).
The item may have been delivered: it is left unknown, never failed, so sending the file again,
as a failed item's advice says, plans nothing to send a second time. The run stops as for any
refusal of its kind: a conflict for safety (exit 4), the others needing attention (exit 3).
Through the real CLI against tests/receiver.py on 127.0.0.1, at N = 1 and N = 8 (16 items,
claimed ahead), on both stores."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send

pytestmark = pytest.mark.both_stores
RETRY = "[retry]\nmax_attempts = 3\nbackoff_base = 0.02\nbackoff_max = 0.1\n"


@pytest.mark.parametrize(
    ("refusal", "n", "code"),
    [(401, 1, 3), (401, 8, 3), (410, 1, 3), (422, 1, 4), (422, 8, 4)],
    ids=["401-1", "401-8", "410-1", "422-1", "422-8"],
)
@pytest.mark.timeout(60)
def test_a_refused_retry_after_a_maybe_delivered_request_is_unknown_and_never_sent_again(
    ws: Workspace, refusal: int, n: int, code: int
) -> None:
    rows = 1 if n == 1 else 2 * n
    answered = threading.Event()  # the first requests' answers, held past the timeout
    receiver = Receiver(
        answer=lambda item_id, nth: refusal if nth == 2 else None, answer_hold=answered
    )
    with receiving(receiver):
        try:
            (ws.path / "notifier.toml").write_text(
                webhook_config(receiver, idempotent=True, status=False, timeout=1, retry=RETRY)
            )
            ws.write_csv("batch.csv", make_rows(rows))
            first = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
            assert first.exit_code == code, first.output
            states = ws.ledger.states()
        finally:
            answered.set()
        tries = Counter(arrival.item_id for arrival in receiver.arrivals)
        retried = {item_id for item_id, nth in tries.items() if nth >= 2}
        assert retried, "some item's retry was refused"
        assert all(states[item_id] == "unknown" for item_id in retried), states
        assert "failed" not in states.values(), states
        again = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        assert again.exit_code == 2, again.output  # its unknown items are settled first
        assert set(receiver.deliveries().values()) == {1}, "no item delivered twice"


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize(("refusal", "code"), [(401, 3), (422, 4)], ids=["401", "422"])
@pytest.mark.timeout(60)
def test_after_a_kill_a_refused_retry_leaves_the_request_that_left_unknown(
    ws: Workspace, n: int, refusal: int, code: int
) -> None:
    """Killed right after item 1's request left (the receiver committed it; its attempt is
    left open, maybe delivered). `resume` sends it again under the same key, as the channel
    dedupes, and the retry is refused (401, or a 422 conflict: exit 4): u1 stays unknown,
    never failed, and the file sent again delivers nothing twice."""
    receiver = Receiver(answer=lambda item_id, nth: refusal if nth == 2 else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=False, timeout=1, retry=RETRY)
        )
        ws.write_csv("batch.csv", make_rows(1 if n == 1 else 2 * n))
        crash_send("after-send:1", db=ws.db, channel="hooks", concurrency=n)
        assert receiver.deliveries().get("u1") == 1
        resumed = ws.invoke("resume", "--concurrency", str(n))
        assert resumed.exit_code == code, resumed.output
        assert ws.ledger.item("u1").state == "unknown", resumed.output
        assert "failed" not in ws.ledger.states().values(), ws.ledger.states()
        again = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        assert again.exit_code == 2, again.output
        assert set(receiver.deliveries().values()) == {1}, "no item delivered twice"
