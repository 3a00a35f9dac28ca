"""The retry policy: what is retried, how long it waits, when it stops (docs/design.md
section 7)."""

from __future__ import annotations

import pytest
import tenacity
from hypothesis import given
from hypothesis import strategies as st

from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.retry import Action, RetryPolicy, action_for


@pytest.mark.parametrize(
    ("kind", "idempotent", "queryable", "action"),
    [
        (ErrorKind.NOT_SENT, False, False, Action.RETRY),
        (ErrorKind.THROTTLED, False, False, Action.RETRY),
        (ErrorKind.IN_PROGRESS, True, True, Action.RETRY),
        (ErrorKind.UNCERTAIN, True, False, Action.RETRY),
        (ErrorKind.UNCERTAIN, False, True, Action.QUERY),
        (ErrorKind.UNCERTAIN, False, False, Action.LOSE),
        (ErrorKind.CONFLICT, True, True, Action.CONFLICT),
        (ErrorKind.GONE, True, True, Action.GONE),
        (ErrorKind.PERMANENT, True, True, Action.FAIL),
    ],
)
def test_action_table(kind: ErrorKind, idempotent: bool, queryable: bool, action: Action) -> None:
    """Uncertain outcomes are retried only where re-sending is safe, queried where that is
    possible, and otherwise left unknown."""
    assert action_for(kind, idempotent=idempotent, queryable=queryable) is action


@given(
    attempts=st.integers(min_value=1, max_value=8),
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=3600)),
)
def test_wait_is_never_shorter_than_retry_after_and_backoff_is_capped(
    attempts: int, retry_after: float | None
) -> None:
    """Full jitter stays within [0, cap] but never below the Retry-After asked for."""
    policy = RetryPolicy(
        max_attempts=10, backoff=tenacity.wait_random_exponential(multiplier=0.5, max=4)
    )
    error = ChannelError(ErrorKind.THROTTLED, "429", http_status=429, retry_after=retry_after)
    verdict = policy.judge(error, attempts=attempts, elapsed_s=0, idempotent=True, queryable=True)
    assert verdict.action is Action.RETRY
    assert verdict.pause_channel
    assert 0 <= verdict.wait_s <= max(4.0, retry_after or 0.0)
    if retry_after is not None:
        assert verdict.wait_s >= retry_after


def test_attempts_and_time_are_both_bounded() -> None:
    """The policy stops at max_attempts, and also once the deadline has passed."""
    policy = RetryPolicy(max_attempts=3, deadline_s=60, backoff=tenacity.wait_fixed(0.01))
    error = ChannelError(ErrorKind.NOT_SENT, "refused")
    judge = policy.judge
    assert judge(error, attempts=2, elapsed_s=1, idempotent=False, queryable=False).action is (
        Action.RETRY
    )
    assert judge(error, attempts=3, elapsed_s=1, idempotent=False, queryable=False).action is (
        Action.EXHAUSTED
    )
    assert judge(error, attempts=1, elapsed_s=61, idempotent=False, queryable=False).action is (
        Action.EXHAUSTED
    )


def test_non_retryable_errors_are_never_waited_on() -> None:
    """Permanent and conflict errors come back at once, whatever the attempt count."""
    policy = RetryPolicy(backoff=tenacity.wait_fixed(100))
    for kind in (ErrorKind.PERMANENT, ErrorKind.CONFLICT, ErrorKind.GONE):
        verdict = policy.judge(
            ChannelError(kind, "x"), attempts=1, elapsed_s=0, idempotent=True, queryable=True
        )
        assert verdict.wait_s == 0


@given(attempts=st.integers(min_value=1, max_value=200), max_attempts=st.integers(1, 10))
def test_throttles_never_spend_attempts_only_the_deadline_bounds_them(
    attempts: int, max_attempts: int
) -> None:
    """However many throttled answers an item had, another one retries (closing the gate)
    while its deadline lasts, and ends it only once the deadline has passed; a later
    non-throttled failure counts only the attempts that were not throttled."""
    policy = RetryPolicy(
        max_attempts=max_attempts, deadline_s=60, backoff=tenacity.wait_fixed(0.01)
    )
    throttle = ChannelError(ErrorKind.THROTTLED, "HTTP 429", http_status=429)
    before = attempts - 1  # every earlier attempt was throttled too
    verdict = policy.judge(throttle, attempts=attempts, elapsed_s=1, idempotent=False,
                           queryable=False, throttled_before=before)  # fmt: skip
    assert (verdict.action, verdict.pause_channel) == (Action.RETRY, True)
    late = policy.judge(throttle, attempts=attempts, elapsed_s=61, idempotent=False,
                        queryable=False, throttled_before=before)  # fmt: skip
    assert (late.action, late.pause_channel) == (Action.EXHAUSTED, True)
    failure = ChannelError(ErrorKind.NOT_SENT, "refused")
    after = policy.judge(failure, attempts=attempts + 1, elapsed_s=1, idempotent=False,
                         queryable=False, throttled_before=attempts)  # fmt: skip
    assert after.action is (Action.RETRY if max_attempts > 1 else Action.EXHAUSTED)
