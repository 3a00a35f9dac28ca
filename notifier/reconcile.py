"""Settling items whose outcome is not known, by asking the downstream by key.

Used by `resume` (before any new item starts), by `cancel` when no worker is alive, by the
runner right after an uncertain error on a non-idempotent channel, and by `reconcile`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

import tenacity

from . import clock, waits
from .channels import Channel, ChannelError, ErrorKind, Receipt
from .records import Attempt, Item, Outcome, PendingKind
from .state_machine import ItemState, ItemTrigger
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
        wait=lambda state: waits.scaled(wait(state)),  # the test switch (waits.py)
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


def query_delay(channel: Channel) -> float:
    """How long after an uncertain attempt ended a 404 from `channel` still proves nothing
    (the receiver may still commit the request). Zero where the channel has no such setting
    (the outbox's write is atomic, so once its writer is gone the file is there or it never
    will be). A channel that dedupes by key waits too: a re-send under the same key is
    harmless, but a 404 taken as proof can end the item as never delivered (failed, expired,
    pending in a cancelled run), and sending the file again then plans it under a new key."""
    return float(getattr(channel, "query_delay_s", 0.0))


def not_found_counts_from(channel: Channel, attempt: Attempt | None) -> datetime | None:
    """The moment from which a 404 for `attempt` proves "not sent": the end of its request
    plus query_delay. An attempt left open by a process that is gone has no known start: its
    `started_at` is when it was claimed, and an item claimed ahead may have waited in the
    queue for seconds before its request left, as late as the moment the holder was found
    gone (now: whoever settles it took the run over first). So its request may run until
    now plus the timeout. An attempt closed as `interrupted` was closed at that moment."""
    delay = query_delay(channel)
    timeout = float(getattr(channel, "timeout_s", 0.0))
    if attempt is None or delay + timeout <= 0:
        return None  # the write is atomic (the outbox)
    if attempt.finished_at is None:
        ended = clock.later(timeout, clock.now())
    elif attempt.outcome == "interrupted":
        ended = clock.later(timeout, clock.parse(attempt.finished_at))
    else:
        ended = clock.parse(attempt.finished_at)
    return clock.later(delay, ended)


@dataclass(frozen=True)
class Settlement:
    item: Item
    outcome: Outcome | None  # None: nothing could be established, nothing changed
    line: str


def settle_item(
    item: Item,
    channel: Channel,
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    not_found_from: datetime | None = None,
) -> Settlement:
    """Decide what an `in_flight` (crashed mid-attempt) or `unknown` item really is.
    Before `not_found_from` (see not_found_counts_from) a 404 proves nothing: the item
    waits, unknown, with that moment as the time to ask again."""
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
                ItemTrigger.FOUND,
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
            Outcome(item.seq, ItemTrigger.CONFLICT, closes, error=f"conflict: {answer.detail}"),
            f"{head} CONFLICT: {answer.detail} → failed; never overwritten",
        )
    early = not_found_from is not None and clock.now() < not_found_from
    if answer is not None and answer.finding is Finding.NOT_FOUND and early:
        assert not_found_from is not None
        when = clock.iso(not_found_from)
        line = (
            f"{head} not found yet, but the receiver may still commit it until {when} "
            "(query_delay) → unknown; NOT sent meanwhile, asked again then"
        )
        if item.state is ItemState.UNKNOWN:
            return Settlement(item, None, line)
        if channel.idempotent:
            # Sent again under the same key, which the receiver dedupes: never proven
            # undelivered, the item stays "maybe delivered" (cancel and expiry see that).
            return Settlement(
                item,
                Outcome(
                    item.seq,
                    ItemTrigger.RETRY_LATER,
                    closes,
                    error="outcome unknown after a stop: not found yet",
                ),
                f"{head} not found yet (the receiver may still commit it until {when}) → the "
                "channel dedupes by key; will send again with the same key",
            )
        return Settlement(
            item,
            Outcome(
                item.seq,
                ItemTrigger.LOSE,
                closes,
                error=f"outcome unknown after a stop: not found yet; asking again at {when}",
                next_attempt_at=when,
            ),
            line,
        )
    if answer is not None and answer.finding is Finding.NOT_FOUND:
        return Settlement(
            item,
            Outcome(item.seq, ItemTrigger.NOT_FOUND, closes),
            f"{head} not found → nothing was delivered; will send again with the same key",
        )
    why = answer.detail if answer is not None else "the channel cannot be queried"
    if item.state is ItemState.UNKNOWN and item.next_attempt_at is not None and not early:
        # It waited for its query_delay and the query still cannot decide: a plain unknown.
        return Settlement(
            item,
            Outcome(item.seq, ItemTrigger.UNDECIDED, error=f"outcome unknown: {why}"),
            f"{head} still unknown ({why}); settle it with `notifier reconcile --manual`",
        )
    if item.state is ItemState.UNKNOWN:
        return Settlement(item, None, f"{head} still unknown ({why})")
    if channel.idempotent:
        return Settlement(
            item,
            Outcome(
                item.seq,
                ItemTrigger.RETRY_LATER,
                closes,
                error=f"outcome unknown after a stop ({why})",
            ),
            f"{head} outcome unknown ({why}) → the channel dedupes by key; will send again "
            "with the same key",
        )
    return Settlement(
        item,
        Outcome(item.seq, ItemTrigger.LOSE, closes, error=f"outcome unknown after a stop ({why})"),
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
    return settle_items(
        store, run_id, channels, lease_version, list(store.items(run_id, states)), say, wait
    )


def settle_items(
    store: Store,
    run_id: str,
    channels: Mapping[str, Channel],
    lease_version: int,
    items: list[Item],
    say: Callable[[str], None],
    wait: tenacity.wait.wait_base = QUERY_WAIT,
    adjust: Callable[[Item, Outcome], Outcome] | None = None,
) -> list[Settlement]:
    """Settle `items` one by one, each recorded before the next is asked about. `adjust`
    lets the runner apply its retry policy to an outcome before it is recorded."""
    settled = []
    for item in items:
        channel = channels[item.channel]
        if item.state is ItemState.UNKNOWN and not channel.queryable:
            continue
        attempts = store.attempts(run_id, item.seq)
        since = not_found_counts_from(channel, attempts[-1] if attempts else None)
        settlement = settle_item(item, channel, wait, since)
        if adjust is not None and settlement.outcome is not None:
            settlement = replace(settlement, outcome=adjust(item, settlement.outcome))
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
        channel = channels[item.channel]
        attempts = store.attempts(run_id, seq)
        since = not_found_counts_from(channel, attempts[-1] if attempts else None)
        settlement = _settle_doubt(item, channel, wait, since)
        outcome = settlement.outcome
        assert outcome is not None  # every doubt ends in a move, unknown at worst
        store.record(run_id, lease_version, [replace(outcome, expected=item.state)])
        say(settlement.line)
        settled.append(settlement)
    return settled


def _settle_doubt(
    item: Item,
    channel: Channel,
    wait: tenacity.wait.wait_base,
    not_found_from: datetime | None,
) -> Settlement:
    head = f"item {item.seq} ({item.item_id}) key {item.idempotency_key}:"
    answer = ask(channel, item, wait) if channel.queryable else None
    if (
        answer is not None
        and answer.finding is Finding.NOT_FOUND
        and not_found_from is not None
        and clock.now() < not_found_from
    ):
        # Too early for a 404 to prove anything: the receiver may still commit the request.
        answer = Answer(
            Finding.UNCERTAIN,
            detail=f"not found yet, but the receiver may still commit it until "
            f"{clock.iso(not_found_from)} (query_delay)",
        )
    if answer is not None and answer.finding is Finding.FOUND:
        assert answer.receipt is not None
        return Settlement(
            item,
            Outcome(
                item.seq,
                ItemTrigger.FOUND,
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence="query at cancel after an uncertain attempt",
            ),
            f"{head} receipt found → sent",
        )
    if answer is not None and answer.finding is Finding.CONFLICT:
        return Settlement(
            item,
            Outcome(item.seq, ItemTrigger.CONFLICT, error=f"conflict: {answer.detail}"),
            f"{head} CONFLICT: {answer.detail} → failed; never overwritten",
        )
    if answer is not None and answer.finding is Finding.NOT_FOUND:
        return Settlement(
            item,
            Outcome(item.seq, ItemTrigger.NOT_FOUND, error=item.last_error),
            f"{head} not found → nothing was delivered; stays pending (attempted, not sent)",
        )
    why = answer.detail if answer is not None else "the channel cannot be queried"
    return Settlement(
        item,
        Outcome(
            item.seq,
            ItemTrigger.DOUBT,
            error=f"an earlier attempt may have been delivered; cancelled before a retry ({why})",
        ),
        f"{head} may have been delivered ({why}) → unknown. "
        "Settle it with `notifier reconcile --manual`",
    )
