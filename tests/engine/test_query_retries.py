"""A status query's further tries stop the moment the run stops: `settle_by_query.ask` asks
`go_on()` right before each further try, so a stop that comes during the wait between two
tries is not followed by one more request. In-process: the retry loop, not the wire. A
real process signalled while its queries are under way is
tests/crash/test_a_signal_stops_status_queries_mid_try.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.records import Item
from notifier.domain.state_machine import ItemState
from notifier.engine.settle_by_query import Finding, ask

from ..receiver import Receiver


def _item() -> Item:
    return Item(
        run_id="r1", seq=1, item_id="u1", channel="hooks", target="t", payload={},
        idempotency_key="k1", intent_digest="sha256:d", state=ItemState.IN_FLIGHT,
        attempts=1, next_attempt_at=None, receipt_id=None, last_error=None,
    )  # fmt: skip


class _Timeouts:
    """A channel whose every status query times out, counting the queries made."""

    def __init__(self) -> None:
        self.queries = 0

    def query(self, key: str) -> Receipt | None:
        self.queries += 1
        raise ChannelError(ErrorKind.UNCERTAIN, "timed out")


@pytest.mark.timeout(10)
def test_a_stop_during_the_wait_between_tries_makes_no_further_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """go_on() says yes when the first try fails, then the stop comes while the sender
    sleeps before the second try: no second request is made, and the item stays uncertain."""
    channel = _Timeouts()
    stopped = False

    def sleep(seconds: float) -> None:
        nonlocal stopped
        stopped = True  # the signal arrives while this sender waits to try again

    # tenacity sleeps through tenacity.nap.sleep, which calls its module's time.sleep.
    monkeypatch.setattr("tenacity.nap.time.sleep", sleep)
    answer = ask(channel, _item(), wait=lambda state: 0.5, go_on=lambda: not stopped)  # type: ignore[arg-type]
    assert stopped
    assert channel.queries == 1
    assert answer.finding == Finding.UNCERTAIN


@pytest.mark.timeout(10)
def test_without_a_stop_a_query_is_tried_three_times() -> None:
    """The counterpart: with go_on() saying yes throughout, a timing-out query is tried
    QUERY_ATTEMPTS (3) times before it reports uncertain."""
    channel = _Timeouts()
    answer = ask(channel, _item(), wait=lambda state: 0.0, go_on=lambda: True)  # type: ignore[arg-type]
    assert channel.queries == 3
    assert answer.finding == Finding.UNCERTAIN


ROWS = 40
N = 8


def _all_sent_then_500(receiver: Receiver) -> Callable[[str, int], int]:
    """An answer that waits until all N senders' first sends have arrived, then says 500
    (uncertain for a channel that cannot dedupe): every sender then asks about its item,
    none having been held back by the uncertain-answers brake."""

    def answer(item: str, nth: int) -> int:
        receiver.wait_for(lambda r: len(r.arrivals) >= N)
        return 500

    return answer
