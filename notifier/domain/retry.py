"""Error classes and the retry policy (docs/design.md section 7).

The policy is a tenacity `Retrying` object — which errors are retried, how long to wait
(exponential backoff with full jitter, never sooner than a Retry-After), when to stop (attempts
and elapsed time) — but tenacity does not run the loop: an attempt's outcome must be durable
before its wait starts, so the runner stores each attempt and asks the policy, from the stored
attempt count and first-attempt time, what comes next. A crash mid-wait loses nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

import tenacity
from tenacity import RetryCallState
from tenacity.wait import wait_base

from notifier.domain import waits
from notifier.domain.answers import ChannelError, ErrorKind

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_DEADLINE_S = 900.0
DEFAULT_BACKOFF_BASE_S = 0.5
DEFAULT_BACKOFF_MAX_S = 30.0
# Requests of one channel in a row that could not reach its receiver (refused, DNS, TLS)
# before the channel is taken as down and the run pauses.
DEFAULT_DOWN_AFTER = 5


class Action(StrEnum):
    RETRY = "retry"  # back to pending with next_attempt_at
    QUERY = "query"  # maybe delivered, not safe to re-send: ask the downstream first
    LOSE = "lose"  # maybe delivered and nobody can tell: unknown, never re-sent blindly
    FAIL = "fail"  # will never succeed: failed
    CONFLICT = "conflict"  # another intent holds the key: failed, halt the run
    GONE = "gone"  # the endpoint is gone: failed, halt the run
    EXHAUSTED = "exhausted"  # retryable, but attempts or time ran out


@dataclass(frozen=True)
class Verdict:
    action: Action
    wait_s: float = 0.0  # RETRY: the item's wait; with pause_channel also the channel's
    pause_channel: bool = False  # 429/503: the whole channel waits, not only this item


def action_for(kind: ErrorKind, *, idempotent: bool, queryable: bool) -> Action:
    """The table of docs/design.md section 7, for one channel's capabilities."""
    if kind in (ErrorKind.NOT_SENT, ErrorKind.THROTTLED, ErrorKind.IN_PROGRESS):
        return Action.RETRY
    if kind is ErrorKind.UNCERTAIN:
        if idempotent:
            return Action.RETRY
        return Action.QUERY if queryable else Action.LOSE
    if kind is ErrorKind.PARTIAL:
        return Action.LOSE  # a re-send would reach again those that got it
    if kind is ErrorKind.CONFLICT:
        return Action.CONFLICT
    if kind is ErrorKind.GONE:
        return Action.GONE
    return Action.FAIL


class wait_at_least_retry_after(wait_base):
    """The backoff, but never less than the Retry-After the downstream asked for (both as
    the test switch scales them: waits.py)."""

    def __init__(self, backoff: wait_base) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = float(self.backoff(retry_state))
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, ChannelError) and error.retry_after is not None:
            wait = max(wait, error.retry_after)
        return waits.scaled(wait)


def _retryable(error: BaseException) -> bool:
    return isinstance(error, ChannelError) and error.kind in (
        ErrorKind.NOT_SENT,
        ErrorKind.THROTTLED,
        ErrorKind.UNCERTAIN,
        ErrorKind.IN_PROGRESS,
    )


class RetryPolicy:
    """Bounded in attempts and in time; waits with full jitter, capped."""

    def __init__(
        self,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        deadline_s: float = DEFAULT_DEADLINE_S,
        backoff: wait_base | None = None,
        down_after: int = DEFAULT_DOWN_AFTER,
    ) -> None:
        self.max_attempts = max_attempts
        self.down_after = down_after
        self.retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable),
            wait=wait_at_least_retry_after(
                backoff
                or tenacity.wait_random_exponential(
                    multiplier=DEFAULT_BACKOFF_BASE_S, max=DEFAULT_BACKOFF_MAX_S
                )
            ),
            stop=tenacity.stop_after_attempt(max_attempts) | tenacity.stop_after_delay(deadline_s),
        )

    @classmethod
    def from_settings(
        cls,
        max_attempts: int,
        deadline_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        down_after: int = DEFAULT_DOWN_AFTER,
    ) -> RetryPolicy:
        return cls(
            max_attempts=max_attempts,
            deadline_s=deadline_s,
            backoff=tenacity.wait_random_exponential(multiplier=backoff_base_s, max=backoff_max_s),
            down_after=down_after,
        )

    def judge(
        self,
        error: ChannelError,
        *,
        attempts: int,
        elapsed_s: float,
        idempotent: bool,
        queryable: bool,
        throttled_before: int = 0,
    ) -> Verdict:
        """What to do after the `attempts`-th attempt failed with `error`, `elapsed_s` after
        the first attempt started. A throttle (429, 503 with Retry-After, an SMTP 4xx slow
        down) is the channel's answer, not the item's: neither it nor the `throttled_before`
        earlier ones count against max_attempts, though the backoff grows with every
        attempt and the deadline bounds them all."""
        action = action_for(error.kind, idempotent=idempotent, queryable=queryable)
        if action is not Action.RETRY:
            return Verdict(action)
        state = self._state(error, attempts, elapsed_s)
        throttled = error.kind is ErrorKind.THROTTLED
        counted = attempts - throttled_before - (1 if throttled else 0)
        if not self.retrying.retry(state) or self.retrying.stop(
            self._state(error, counted, elapsed_s)
        ):
            # The item is done, but a throttled answer still asks the whole channel to wait:
            # the wait is what a retry would have waited, so the next item honours it.
            return Verdict(
                Action.EXHAUSTED,
                wait_s=float(self.retrying.wait(state)) if throttled else 0.0,
                pause_channel=throttled,
            )
        return Verdict(
            Action.RETRY, wait_s=float(self.retrying.wait(state)), pause_channel=throttled
        )

    def backoff(self, error: ChannelError, attempts: int) -> float:
        """The wait before the next try of an item whose request never reached its receiver:
        such an item is never given up on (the channel is down, not the item), so only the
        wait applies."""
        return float(self.retrying.wait(self._state(error, attempts, 0.0)))

    def _state(self, error: ChannelError, attempts: int, elapsed_s: float) -> RetryCallState:
        state = RetryCallState(self.retrying, fn=None, args=(), kwargs={})
        state.attempt_number = attempts
        state.start_time = time.monotonic() - elapsed_s
        state.set_exception((type(error), error, None))
        return state
