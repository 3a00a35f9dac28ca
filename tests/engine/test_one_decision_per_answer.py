"""Each answer is decided once, and each throttled answer closes its channel once: the
whole engine in-process (notifier.api) against a scripted receiver that answers uncertain
(settled by its status query), throttled and delivered, on both stores, at N = 1 and at
N = 8 with items claimed ahead. The spies count calls to the one decision (`decide`) and to
the gate."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import (
    DELIVER,
    LOST_AFTER_COMMIT,
    LOST_BEFORE_COMMIT,
    Channels,
    Response,
    ScriptedChannel,
    throttle,
)
from notifier.domain import decide as decide_module
from notifier.domain.evidence import AfterSend
from notifier.domain.intent import Intent
from notifier.domain.state_machine import RunState
from notifier.engine import judging, sending
from notifier.engine.runner import RunResult

from ..conftest import Workspace, make_rows
from .test_every_answer_settles_once import config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
ROWS = 30
FIRST = (LOST_AFTER_COMMIT, throttle(0.05), DELIVER, LOST_BEFORE_COMMIT, throttle(0.05))


def script(intent: Intent, tries: int) -> Response:
    return FIRST[intent.seq % len(FIRST)] if tries == 0 else DELIVER


@pytest.mark.parametrize("n", [1, 8])
def test_each_answer_is_decided_once_and_each_throttle_gates_once(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    decided: Counter[tuple[int, int]] = Counter()  # (seq, attempt) -> decisions on its answer
    gated: list[str] = []
    real_decide, real_gate = decide_module.decide, judging.Progress.gate

    def counting_decide(item: Any, evidence: Any, **kwargs: Any) -> Any:
        if isinstance(evidence, AfterSend) and not isinstance(evidence.result, judging.NotStarted):
            decided[item.seq, item.attempts] += 1
        return real_decide(item, evidence, **kwargs)

    def counting_gate(progress: judging.Progress, channel: str, until: float) -> None:
        # A shared run also re-reads each turn the gates stored with the outcomes (other
        # workers' throttles, Coordination.watch): those close no gate for an answer here.
        if sys._getframe(1).f_code.co_name != "watch":
            gated.append(channel)
        real_gate(progress, channel, until)

    for module in (judging, sending, decide_module):
        if hasattr(module, "decide"):
            monkeypatch.setattr(module, "decide", counting_decide)
    monkeypatch.setattr(judging.Progress, "gate", counting_gate)

    channel = ScriptedChannel("hooks", script, idempotent=False)
    ws.write_csv("batch.csv", make_rows(ROWS))
    notifier = Notifier.open(
        ws.db, config=config(idempotent=False, queryable=True), channels=Channels(hooks=channel)
    )
    result = notifier.send(Path("batch.csv"), channel="hooks", concurrency=n)
    assert isinstance(result, RunResult) and result.state is RunState.COMPLETED, result
    assert channel.twice() == {}

    answers = sum(channel.requests.values())
    assert sum(decided.values()) == answers, "one decision for every answer"
    assert max(decided.values()) == 1, [k for k, v in decided.items() if v > 1]
    throttled = sum(
        1 for seq in range(1, ROWS + 1) if FIRST[seq % len(FIRST)].kind.value == "throttle"
    )
    assert gated == ["hooks"] * throttled, "each throttled answer closes its channel once"
