"""The test switch of notifier/domain/waits.py as the tests use it: a test that waits out a
Retry-After or a backoff asks for `fast_waits`, and its CLI (in-process and every child
process, which inherits the environment) waits FACTOR of each such wait; the test then pins
the rule against the scaled wait, so it still fails if the wait is not kept."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifier.domain import clock, waits

# A Retry-After of 1 s (the least the wire can say) becomes 0.25 s: still far above the
# milliseconds between two requests when nothing makes the sender wait, so a test that pins
# a wait still fails without it.
FACTOR = 0.25


def scale_waits(monkeypatch: pytest.MonkeyPatch, factor: float = FACTOR) -> float:
    """Turn the switch on for the rest of the test; the factor set."""
    monkeypatch.setenv(waits.ENV, repr(factor))
    assert waits.scale() == factor
    return factor


def no_scaled_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch off (as in production), whatever the developer's shell exported."""
    monkeypatch.delenv(waits.ENV, raising=False)


# Far past any receiver's window in the tests (`timeout + query_delay`: seconds).
PAST_EVERY_WINDOW = timedelta(minutes=5)


def past_every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's wall clock moved on (notifier/domain/clock.py's test switch): for the
    commands the test runs in-process from here, every receiver's window opened until now
    has passed, with nothing waited for; called again, it moves on again, past the windows
    the commands in between opened. Real processes started from here keep the real clock."""
    monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + PAST_EVERY_WINDOW)
