"""Whatever a receiver answers, each key reaches it at most once and the ledger says which:
the whole engine in-process (notifier.api) against a scripted receiver
(notifier/channels/scripted.py), on both stores, at N = 1 and at N = 8 with items claimed
ahead. No socket, no subprocess: what is pinned is the engine's own doing."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import (
    DELIVER,
    LOST_AFTER_COMMIT,
    LOST_BEFORE_COMMIT,
    REFUSE,
    REJECT,
    Channels,
    Response,
    ScriptedChannel,
    throttle,
)
from notifier.config import Config, RetrySettings
from notifier.domain.intent import Intent
from notifier.domain.state_machine import RunState
from notifier.engine.runner import RunResult

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
CONCURRENCY = pytest.mark.parametrize("n", [1, 8])
ROWS = 48
# The first answer each item gets, in turn; every later request is delivered.
FIRST = (DELIVER, LOST_AFTER_COMMIT, LOST_BEFORE_COMMIT, throttle(0.05), REFUSE, DELIVER)


LOST = {3: LOST_AFTER_COMMIT, 16: LOST_BEFORE_COMMIT, 29: LOST_AFTER_COMMIT, 40: LOST_BEFORE_COMMIT}


def first_answer_then_deliver(intent: Intent, tries: int) -> Response:
    return FIRST[intent.seq % len(FIRST)] if tries == 0 else DELIVER


def config(*, idempotent: bool, queryable: bool) -> Config:
    definition: dict[str, object] = {
        "type": "webhook",
        "url": "http://127.0.0.1:9/notifications",  # never dialled: the script answers
        "idempotent": idempotent,
        "timeout": 0.2,
        "query_delay": 0,
    }
    if queryable:
        definition["status_url"] = "http://127.0.0.1:9/notifications/{key}"
    retry = RetrySettings(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05)
    return Config(path=None, channels={"hooks": definition}, retry=retry)


def send(ws: Workspace, channel: ScriptedChannel, n: int, *, queryable: bool) -> RunResult:
    ws.write_csv("batch.csv", make_rows(ROWS))
    notifier = Notifier.open(
        ws.db,
        config=config(idempotent=channel.idempotent, queryable=queryable),
        channels=Channels(hooks=channel),
    )
    result = notifier.send(Path("batch.csv"), channel="hooks", concurrency=n)
    assert isinstance(result, RunResult), result
    return result


@CONCURRENCY
def test_a_receiver_that_can_be_asked_gets_every_notification_exactly_once(
    ws: Workspace, n: int
) -> None:
    """Lost answers, throttles and refusals from a receiver that can be asked but does not
    dedupe: every item ends sent and each key is delivered once: a lost answer is settled by
    the query (a delivery found is recorded; none, once the window has passed, is sent
    again), never by sending blindly."""
    channel = ScriptedChannel("hooks", first_answer_then_deliver, idempotent=False)
    result = send(ws, channel, n, queryable=True)
    assert result.state is RunState.COMPLETED, result
    assert result.counts.sent == ROWS
    assert channel.twice() == {}
    assert len(channel.deliveries) == ROWS
    assert ws.ledger.state_counts() == {"sent": ROWS}


@CONCURRENCY
def test_a_receiver_that_can_neither_dedupe_nor_be_asked_is_never_sent_twice(
    ws: Workspace, n: int
) -> None:
    """The same answers from a receiver like SMTP: a lost answer is `unknown`, never sent
    again; what was refused or throttled before anything left is sent once; a rejection
    fails its item. Each key reaches the receiver at most once, and exactly the `sent` and
    the `unknown` keys are those that may have."""

    def script(intent: Intent, tries: int) -> Response:
        # Four lost answers in all: fewer than the unknown streak that halts a run, in any
        # order the senders' answers are committed in.
        if intent.seq in LOST:
            return LOST[intent.seq] if tries == 0 else DELIVER
        if intent.seq == 7:
            return REJECT
        answer = first_answer_then_deliver(intent, tries)
        return DELIVER if answer in (LOST_AFTER_COMMIT, LOST_BEFORE_COMMIT) else answer

    channel = ScriptedChannel("hooks", script, idempotent=False, queryable=False)
    result = send(ws, channel, n, queryable=False)
    assert channel.twice() == {}
    by_state: dict[str, set[str]] = {}
    for item in ws.ledger.items():
        by_state.setdefault(item.state, set()).add(item.idempotency_key)
    delivered = set(channel.deliveries)
    assert by_state["sent"] <= delivered
    keys = {item.seq: item.idempotency_key for item in ws.ledger.items()}
    assert by_state["unknown"] == {keys[seq] for seq in LOST}
    assert delivered <= by_state["sent"] | by_state["unknown"]
    assert len(by_state["failed"]) == 1
    assert result.state is not RunState.COMPLETED
