"""A status endpoint that answers every query 429 cannot hold a run open for ever: an item
the run must ask about (a send's uncertain answer whose query was put off, or an unknown
item revisited once its query_delay passed) waits out a few throttled answers, each for its
Retry-After, and is then left unknown, never sent again, for `reconcile` to ask about later;
the run ends. At N = 1 and at N = 8 with items claimed ahead, on both stores."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.state_machine import ItemState
from notifier.engine.run_control import Stop
from notifier.engine.settle_by_query import THROTTLED_ASKS

from ..conftest import Workspace
from ..support.held import WAIT_S, Answered, HeldRun

RETRY_AFTER_S = 0.05


@dataclass
class _ThrottlesEveryQuery(Answered):
    """Item 1's send is answered as a 502 would be (maybe delivered, on a channel that
    cannot dedupe: it must be asked about); every other item is delivered. The first
    `unthrottled` status queries of an item find nothing; every later one is answered 429
    with a short Retry-After, for good."""

    unthrottled: int = 0
    asked: Counter[str] = field(default_factory=Counter)

    def query(self, key: str) -> Receipt | None:
        with self.changed:
            self.asked[key] += 1
            if self.asked[key] <= self.unthrottled:
                return None
        raise ChannelError(
            ErrorKind.THROTTLED, "HTTP 429", http_status=429, retry_after=RETRY_AFTER_S
        )


def _answer(item: str) -> Receipt | ChannelError:
    if item == "1":
        return ChannelError(ErrorKind.UNCERTAIN, "HTTP 502", http_status=502)
    return Receipt("r-" + item)


@pytest.mark.both_stores
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("asked_as", ["put-off", "revisited"])
def test_an_item_whose_every_query_is_throttled_is_left_unknown_and_the_run_ends(
    ws: Workspace, n: int, asked_as: str
) -> None:
    """put-off: the send's own query is throttled, and the question pool asks it; revisited:
    the send's query finds nothing before the receiver's query_delay has passed (no proof),
    so the item waits, unknown, and the runner's revisit asks it."""
    items = 4 * n + 4
    revisited = asked_as == "revisited"
    channel = _ThrottlesEveryQuery(
        idempotent=False,
        answer=_answer,
        query_delay_s=0.2 if revisited else 0.0,
        unthrottled=1 if revisited else 0,
    )
    channel.let_all_go()
    run = HeldRun(ws, channel, n, items, hold=False)
    run.thread.start()
    run.thread.join(WAIT_S)
    ended = not run.thread.is_alive()
    if not ended:  # free the thread before failing, so that the test ends
        run.runner.control.request(Stop.INTERRUPTED, "the test gave up waiting")
        run.thread.join(WAIT_S)
    states = Counter(item.state for item in run.store.queries.items("r1"))
    run.store.close()
    assert ended, f"the run was still asking after {WAIT_S} s: {dict(channel.asked)}"
    assert run.results[0].stop is Stop.UNKNOWN_LEFT, run.results  # paused: reconcile it
    assert states == {ItemState.SENT: items - 1, ItemState.UNKNOWN: 1}, states
    assert [item for item, _ in channel.started].count("1") == 1, "item 1 was sent again"
    # Its throttled answers were waited out and asked again, a bounded number of times.
    assert 2 <= channel.asked["k1"] <= THROTTLED_ASKS + 1, channel.asked
    assert set(channel.asked) == {"k1"}, channel.asked
    if n > 1:
        assert len(channel.started) == items  # every item sent, those claimed ahead too
