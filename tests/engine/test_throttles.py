"""A throttle is the channel's answer, not the item's: 429s, and an SMTP relay's 451 slow
down, close the channel's gate and never spend an item's max_attempts; only the item's
deadline bounds them. Through the real CLI, on both stores, at concurrency 1 and 8."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..smtp_relay import each_key_once, relay

pytestmark = pytest.mark.both_stores
FEW_ATTEMPTS = "[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.05\n"


@pytest.mark.parametrize("n", [1, 8])
def test_five_429s_in_a_row_do_not_fail_an_item(ws: Workspace, n: int) -> None:
    """With max_attempts = 2, an item answered 429 five times and then 200 is sent, not
    failed after its second throttle."""
    receiver = Receiver(answer=lambda item_id, k: 429 if item_id == "u3" and k <= 5 else None)
    receiver.retry_after = "0"
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=False, retry=FEW_ATTEMPTS)
        )
        ws.write_csv("b.csv", make_rows(10))
        result = ws.invoke("send", "b.csv", "--channel", "hooks", "--concurrency", str(n))
    assert result.exit_code == 0, result.output
    assert receiver.posts("u3") == 6
    assert ws.status()["counts"]["sent"] == 10


@pytest.mark.parametrize("n", [1, 8])
def test_a_relay_answering_451_again_and_again_fails_no_message(ws: Workspace, n: int) -> None:
    """A relay that answers `451 4.7.1 too much mail` eight times in a row, with
    max_attempts = 2: every message is delivered once, none fails."""
    with relay(ws, "\n" + FEW_ATTEMPTS) as handler:
        handler.mail_answers = ["451 4.7.1 too much mail, slow down"] * 8
        ws.write_csv("b.csv", make_rows(5))
        result = ws.invoke("send", "b.csv", "--channel", "mail", "--concurrency", str(n))
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
    assert ws.status()["counts"]["failed"] == 0


@pytest.mark.parametrize("n", [1, 8])
def test_one_recipients_450_at_rcpt_is_its_own_not_the_channels(ws: Workspace, n: int) -> None:
    """A recipient whose RCPT is answered `450 4.2.1` every time retries on its own backoff
    until its attempts are spent (it fails, naming the refusal), while the channel's gate
    stays open: every other message goes, and no answer is recorded as a throttle."""
    with relay(ws, "\n" + FEW_ATTEMPTS) as handler:
        handler.rcpt_answers = {"user3@example.com": "450 4.2.1 Mailbox busy, try later"}
        ws.write_csv("b.csv", make_rows(6))
        result = ws.invoke("send", "b.csv", "--channel", "mail", "--concurrency", str(n))
        assert result.exit_code == 3, result.output
        delivered = sorted(m["To"] for m in handler.messages)
    assert delivered == [f"user{i}@example.com" for i in (1, 2, 4, 5, 6)]
    states = ws.ledger.states()
    assert states.pop("u3") == "failed" and set(states.values()) == {"sent"}
    assert "RCPT TO (450" in (ws.ledger.item("u3").last_error or "")
    assert [a for a in ws.ledger.attempts() if a.outcome == "throttled"] == []
