"""The test switch for waits: NOTIFIER_TEST_WAIT_SCALE (modelled on stamina's `set_testing`).

A test suite that drives the real CLI, in this process or in a child process, would otherwise
sleep through real seconds: a Retry-After of 2 on the wire (delay-seconds: never less than
one), an exponential backoff, a lease's TTL. Setting NOTIFIER_TEST_WAIT_SCALE to a factor in
(0, 1] makes every such wait that factor of itself, in every process that inherits the
variable, while keeping each rule: "no request before Retry-After has passed" still holds,
against the scaled wait, and a test pins it by comparing with `scaled(...)` of what it asked.

Unset (production), the factor is 1.0 and nothing changes. It is read here and only here, on
each call, so a test may set it with monkeypatch for an in-process CLI as well.

Scaled: the wait the retry policy gives (its backoff, never less than a Retry-After), the
same wait restored from the database by a new process, the pause between the tries of a
status query, and the Claude drafter's retry wait.
Not scaled: the bounds an operator sets on waiting (--max-wait, cancel --wait, the retry
deadline), a request's timeout, an approval's expiry, --rate, and a lease's TTL: those are
measured against the world (a frozen holder, a loaded machine's heartbeat), and scaling them
would test another promise than the one production keeps.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

ENV = "NOTIFIER_TEST_WAIT_SCALE"


def scale() -> float:
    """The factor every wait is multiplied by: 1.0 unless NOTIFIER_TEST_WAIT_SCALE says."""
    return _parse(os.environ.get(ENV, ""))


def scaled(seconds: float) -> float:
    """`seconds` of waiting, as long as the test switch makes it (unchanged in production)."""
    factor = scale()
    return seconds if factor == 1.0 else seconds * factor


@lru_cache(maxsize=8)
def _parse(raw: str) -> float:
    if not raw.strip():
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        factor = math.nan
    if not (0 < factor <= 1):  # also NaN
        # A test switch set wrong must not silently run real waits, nor no waits at all.
        raise ValueError(f"{ENV}={raw!r}: expected a factor in (0, 1], e.g. 0.1")
    return factor
