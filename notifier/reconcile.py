"""Settling items whose outcome is not known, by asking the downstream by key.

Used by `resume` (before any new item starts), by `cancel` when no worker is alive, by the
runner right after an uncertain error on a non-idempotent channel, and by `reconcile`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

import tenacity

from .channels import Channel, ChannelError, ErrorKind, Receipt
from .records import Item, Outcome, PendingKind
from .state_machine import ItemState
from .store import Store

# A query is read-only, so it may be retried freely; but it must not hold up a resume for
# long, so a few quick tries and then the item is reported as undecided.
QUERY_ATTEMPTS = 3
QUERY_WAIT = tenacity.wait_exponential(multiplier=0.2, max=2)


class Finding(StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class Answer:
    finding: Finding
    receipt: Receipt | None = None
    detail: str = ""


def ask(channel: Channel, item: Item, wait: tenacity.wait.wait_base = QUERY_WAIT) -> Answer:
    """Query `channel` for `item`'s key and compare what it holds with the item's digest."""
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(
            lambda e: (
                isinstance(e, ChannelError)
                and e.kind in (ErrorKind.UNCERTAIN, ErrorKind.NOT_SENT, ErrorKind.THROTTLED)
            )
        ),
        stop=tenacity.stop_after_attempt(QUERY_ATTEMPTS),
        wait=wait,
        reraise=True,
    )
    try:
        receipt = retrying(channel.query, item.idempotency_key)
    except ChannelError as exc:
        return Answer(Finding.UNCERTAIN, detail=f"query failed: {exc}")
    if receipt is None:
        return Answer(Finding.NOT_FOUND, detail="the downstream holds nothing under this key")
    if receipt.intent_digest is not None and receipt.intent_digest != item.intent_digest:
        return Answer(
            Finding.CONFLICT,
            receipt,
            f"the downstream holds another intent under this key ({receipt.intent_digest})",
        )
    return Answer(Finding.FOUND, receipt, "receipt found by query")


@dataclass(frozen=True)
class Settlement:
    item: Item
    outcome: Outcome | None  # None: nothing could be established, nothing changed
    line: str


def settle_item(
    item: Item, channel: Channel, wait: tenacity.wait.wait_base = QUERY_WAIT
) -> Settlement:
    """Decide what an `in_flight` (crashed mid-attempt) or `unknown` item really is."""
    closes = "interrupted" if item.state is ItemState.IN_FLIGHT else None
    head = f"item {item.seq} ({item.item_id}) key {item.idempotency_key}:"
    answer = ask(channel, item, wait) if channel.queryable else None
    if answer is not None and answer.finding is Finding.FOUND:
        assert answer.receipt is not None
        match = "digest matches" if answer.receipt.intent_digest else "no digest reported"
        return Settlement(
            item,
            Outcome(
                item.seq,
                "found",
                closes,
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence=f"query: {match}",
            ),
            f"{head} receipt found ({match}) → sent; not sent again",
        )
    if answer is not None and answer.finding is Finding.CONFLICT:
        return Settlement(
            item,
            Outcome(item.seq, "conflict", closes, error=f"conflict: {answer.detail}"),
            f"{head} CONFLICT: {answer.detail} → failed; never overwritten",
        )
    if answer is not None and answer.finding is Finding.NOT_FOUND:
        return Settlement(
            item,
            Outcome(item.seq, "not_found", closes),
            f"{head} not found → nothing was delivered; will send again with the same key",
        )
    why = answer.detail if answer is not None else "the channel cannot be queried"
    if item.state is ItemState.UNKNOWN:
        return Settlement(item, None, f"{head} still unknown ({why})")
    if channel.idempotent:
        return Settlement(
            item,
            Outcome(item.seq, "retry_later", closes, error=f"outcome unknown after a stop ({why})"),
            f"{head} outcome unknown ({why}) → the channel dedupes by key; will send again "
            "with the same key",
        )
    return Settlement(
        item,
        Outcome(item.seq, "lose", closes, error=f"outcome unknown after a stop ({why})"),
        f"{head} outcome unknown ({why}) → unknown; NOT sent again. "
        "Settle it with `notifier reconcile --manual`",
    )


def settle(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    *,
    include_unknown: bool,
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
) -> list[Settlement]:
    """Settle every in-flight item (and, with `include_unknown`, every unknown item whose
    channel can be queried), each recorded before the next is asked about."""
    states = [ItemState.IN_FLIGHT, ItemState.UNKNOWN] if include_unknown else [ItemState.IN_FLIGHT]
    settled = []
    for item in list(store.items(run_id, states)):
        channel = channels[item.channel]
        if item.state is ItemState.UNKNOWN and not channel.queryable:
            continue
        settlement = settle_item(item, channel, wait)
        if settlement.outcome is not None:
            store.record(run_id, lease_version, [replace(settlement.outcome, expected=item.state)])
        say(settlement.line)
        settled.append(settlement)
    return settled


def settle_doubts(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    *,
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
) -> list[Settlement]:
    """For `cancel`: every pending item whose last uncertain attempt may have been delivered
    (it was waiting to retry on a channel that dedupes) is settled by query where the channel
    can be queried, and otherwise becomes unknown: a cancelled run never reports a
    maybe-delivered item as never attempted."""
    kinds = store.pending_kinds(run_id)
    doubtful = [seq for seq, kind in kinds.items() if kind is PendingKind.MAYBE_DELIVERED]
    settled = []
    for seq in doubtful:
        item = store.item(run_id, seq)
        settlement = _settle_doubt(item, channels[item.channel], wait)
        outcome = settlement.outcome
        assert outcome is not None  # every doubt ends in a move, unknown at worst
        store.record(run_id, lease_version, [replace(outcome, expected=item.state)])
        say(settlement.line)
        settled.append(settlement)
    return settled


def _settle_doubt(item: Item, channel: Channel, wait: tenacity.wait.wait_base) -> Settlement:
    head = f"item {item.seq} ({item.item_id}) key {item.idempotency_key}:"
    answer = ask(channel, item, wait) if channel.queryable else None
    if answer is not None and answer.finding is Finding.FOUND:
        assert answer.receipt is not None
        return Settlement(
            item,
            Outcome(
                item.seq,
                "found",
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence="query at cancel after an uncertain attempt",
            ),
            f"{head} receipt found → sent",
        )
    if answer is not None and answer.finding is Finding.CONFLICT:
        return Settlement(
            item,
            Outcome(item.seq, "conflict", error=f"conflict: {answer.detail}"),
            f"{head} CONFLICT: {answer.detail} → failed; never overwritten",
        )
    if answer is not None and answer.finding is Finding.NOT_FOUND:
        return Settlement(
            item,
            Outcome(item.seq, "not_found", error=item.last_error),
            f"{head} not found → nothing was delivered; stays pending (attempted, not sent)",
        )
    why = answer.detail if answer is not None else "the channel cannot be queried"
    return Settlement(
        item,
        Outcome(
            item.seq,
            "doubt",
            error=f"an earlier attempt may have been delivered; cancelled before a retry ({why})",
        ),
        f"{head} may have been delivered ({why}) → unknown. "
        "Settle it with `notifier reconcile --manual`",
    )
