"""The test switch for waits (notifier/domain/waits.py): off, it changes nothing; on, every retry
wait is that fraction of itself, a Retry-After included; set wrong, it refuses to guess."""

from __future__ import annotations

import itertools
import time

import pytest
import tenacity

from notifier.domain import waits
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.records import Item
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import ItemState
from notifier.engine.settle_by_query import Finding, ask
from notifier.store import Store

from ..conftest import Workspace, make_rows


def _throttled_wait(retry_after: float) -> float:
    policy = RetryPolicy(max_attempts=5, backoff=tenacity.wait_fixed(0.01))
    error = ChannelError(ErrorKind.THROTTLED, "429", http_status=429, retry_after=retry_after)
    verdict = policy.judge(error, attempts=1, elapsed_s=0, idempotent=True, queryable=True)
    return verdict.wait_s


@pytest.mark.timeout(10)
def test_unset_the_waits_are_as_asked() -> None:
    """Without NOTIFIER_TEST_WAIT_SCALE (production) the factor is 1 and a Retry-After of
    2 s is waited out in full."""
    assert waits.scale() == 1.0
    assert waits.scaled(2.0) == 2.0
    assert _throttled_wait(2.0) == 2.0


@pytest.mark.timeout(10)
def test_on_every_retry_wait_is_scaled(fast_waits: float) -> None:
    """With the switch on, the policy's wait (never less than Retry-After) and a backoff are
    both the factor of themselves."""
    assert fast_waits < 1
    assert _throttled_wait(2.0) == pytest.approx(2.0 * fast_waits)
    policy = RetryPolicy(max_attempts=5, backoff=tenacity.wait_fixed(0.4))
    refused = ChannelError(ErrorKind.NOT_SENT, "refused")
    assert policy.backoff(refused, 1) == pytest.approx(0.4 * fast_waits)


@pytest.mark.timeout(10)
def test_on_the_pauses_between_status_queries_are_scaled(fast_waits: float) -> None:
    """The tries of a status query that keeps failing are spaced the factor of the
    query's wait: never closer (the wait is kept), never the whole of it."""
    asked: list[float] = []

    class Failing:
        def query(self, key: str) -> Receipt | None:
            asked.append(time.monotonic())
            raise ChannelError(ErrorKind.UNCERTAIN, "504")

    item = Item("r", 1, "u1", "hooks", "t", {}, "k1", "sha256:x", ItemState.PENDING, 1,
                None, None, None)  # fmt: skip
    answer = ask(Failing(), item, tenacity.wait_fixed(0.8))  # type: ignore[arg-type]
    assert answer.finding is Finding.UNCERTAIN
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert len(gaps) == 2
    assert all(0.95 * 0.8 * fast_waits <= gap < 0.8 for gap in gaps), gaps


@pytest.mark.parametrize("raw", ["0", "-1", "2", "nan", "fast", "inf"])
@pytest.mark.timeout(10)
def test_a_factor_out_of_range_is_refused(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A factor of 0 would make a wait's test unable to fail, above 1 would slow production
    down, and garbage would silently mean real waits: each one is refused by name."""
    monkeypatch.setenv(waits.ENV, raw)
    with pytest.raises(ValueError, match=waits.ENV):
        waits.scale()


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_new_process_restores_a_gate_as_scaled(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Retry-After stored by one process is honoured by the next one at the same scale
    the retry policy waited it: the gate a resume restores is 30 s, or 30 s times the
    factor with the switch on."""
    ws.write_csv("batch.csv", make_rows(1))
    assert ws.invoke("send", "batch.csv").exit_code == 0
    (item,) = ws.ledger.items()
    run_id, seq = item.run_id, item.seq
    finished = "2030-01-01T00:00:00.000000+00:00"
    ws.forge.throttled_answer(run_id, seq, 30, finished)

    def gate() -> str:
        store = Store.open(ws.db, readonly=True)
        try:
            return store.queries.throttled_until(run_id)["outbox"]
        finally:
            store.close()

    assert gate() == "2030-01-01T00:00:30.000000+00:00"
    monkeypatch.setenv(waits.ENV, "0.1")
    assert gate() == "2030-01-01T00:00:03.000000+00:00"
