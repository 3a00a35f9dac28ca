"""Rates per recipient domain: `[channels.NAME.domain_rates]`, e.g.
`"gmail.com" = 5`, at most that many sends per second to addresses at that domain.

One token bucket per channel and domain, made by the runner's own bucket factory: a bucket
of this process on SQLite (one process works a run), and on PostgreSQL one kept in the
database (rate_buckets, keyed `CHANNEL@DOMAIN`, which no channel name can be: the config
refuses `@` in one), so all the workers of a run together keep the rate. A send takes its
channel's token first (`rate`, `--rate`), then its domain's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from notifier.domain.records import Item
from notifier.domain.suppression import domain_key


class Bucket(Protocol):
    def take(self, stop: Callable[[], bool], max_wait_s: float = math.inf) -> float | None: ...


def domain_of(target: str) -> str | None:
    """The domain of an address (`Ann <ann@Example.COM>` → example.com) as domain_key
    spells it; None without one."""
    address = target.strip().rsplit("<", 1)[-1].rstrip(">").strip()
    if "@" not in address:
        return None
    return domain_key(address.rsplit("@", 1)[1]) or None


class DomainRates:
    """The buckets of every channel's `domain_rates`."""

    def __init__(
        self,
        snapshot: Mapping[str, Mapping[str, Any]],
        make: Callable[[str, float, str], Bucket],
    ) -> None:
        self._buckets: dict[tuple[str, str], Bucket] = {}
        for channel, definition in snapshot.items():
            for domain, rate in (definition.get("domain_rates") or {}).items():
                key = domain_key(domain)
                self._buckets[(channel, key)] = make(channel, float(rate), key)

    def take(
        self, item: Item, stop: Callable[[], bool], max_wait_s: float = math.inf
    ) -> float | None:
        """Bucket.take for the item's channel and recipient domain (None at once when that
        domain has no rate)."""
        if not self._buckets:
            return None
        domain = domain_of(item.target)
        bucket = self._buckets.get((item.channel, domain)) if domain else None
        return None if bucket is None else bucket.take(stop, max_wait_s)
