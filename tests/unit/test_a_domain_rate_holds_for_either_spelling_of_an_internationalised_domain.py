"""`domain_rates` is a rate per recipient domain (docs/guarantees.md, "Send windows, a start
time, rates per recipient domain"): an internationalised domain is one domain however it is
written, `bücher.example` or `xn--bcher-kva.example` (what the wire carries, and what the
suppression list already treats as the same address). A rate given under one spelling holds
for rows written in the other, and rows in both spellings draw from one bucket: the
receiving server never gets twice the rate, nor an unlimited stream."""

from __future__ import annotations

import pytest

from notifier.domain.records import Item
from notifier.domain.state_machine import ItemState
from notifier.engine.domain_rates import DomainRates
from notifier.engine.pipeline import TokenBucket

UNICODE, PUNYCODE = "bücher.example", "xn--bcher-kva.example"


def _item(seq: int, target: str) -> Item:
    return Item(
        "r1", seq, str(seq), "mail", target, {}, f"k{seq}", f"sha256:{seq}", ItemState.IN_FLIGHT,
        1, None, None, None,
    )  # fmt: skip


def _never() -> bool:
    return False


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("configured", "first", "second"),
    [
        (UNICODE, UNICODE, PUNYCODE),
        (UNICODE, PUNYCODE, PUNYCODE),
        (PUNYCODE, UNICODE, UNICODE),
        (PUNYCODE, PUNYCODE, UNICODE),
    ],
)
def test_a_domain_rate_holds_for_either_spelling_of_an_internationalised_domain(
    configured: str, first: str, second: str
) -> None:
    """One send per 100 s to the domain: the first send takes the one token; the second,
    to the same domain in either spelling, must wait (never None at once)."""
    snapshot = {"mail": {"domain_rates": {configured: 0.01}}}
    rates = DomainRates(snapshot, lambda _channel, rate, _domain: TokenBucket(rate))
    assert rates.take(_item(1, f"ann@{first}"), _never, max_wait_s=0) is None
    wait = rates.take(_item(2, f"bob@{second}"), _never, max_wait_s=0)
    assert wait is not None and wait > 50, (
        f"a second send to {second} went at once under the rate given for {configured}"
    )
