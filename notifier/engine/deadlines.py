"""An item's not_after, checked twice: when it is claimed (`split_stale`) and again right
before its send (`past_deadline`, asked by the run control's `may_start`), since an item
claimed ahead may wait past it for a free sender. Either way it is never sent late:
released, never attempted, it is expired by the next pass, or settled if an earlier attempt
may have reached the recipient."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from notifier.channels import Channel
from notifier.domain import clock
from notifier.domain.evidence import Caps, not_found_counts_from
from notifier.domain.records import AttemptOutcome, Item, Outcome
from notifier.domain.state_machine import ItemState, ItemTrigger
from notifier.store import Store


def past_deadline(item: Item, now: datetime) -> str | None:
    """An item claimed before its not_after may wait past it for a free sender (or the
    channel's lock, or a --rate token): then it does not start. Released, never attempted,
    it is expired by the next pass, or settled if an earlier attempt may have reached the
    recipient."""
    if deadline_passed(item, now):
        return f"not_after {item.not_after} passed before it started"
    return None


def deadline_passed(item: Item, now: datetime) -> bool:
    """Whether the item's not_after (if it has one) is over at `now`: checked when it is
    claimed (`split_stale`) and again right before its send (`past_deadline`)."""
    return item.not_after is not None and clock.parse(item.not_after) <= now


def split_stale(
    store: Store,
    run_id: str,
    window: list[Item],
    channels: Mapping[str, Channel],
) -> tuple[list[Item], list[Outcome]]:
    """Claimed items whose deadline passed are not sent. One never possibly delivered
    goes back to pending, its claim not counted as an attempt (no request left), where the
    next expiry pass expires it; one that an earlier attempt may have reached becomes
    unknown, to be settled rather than expired blindly: on a channel of `channels` that can
    be asked, asked about again by the runner's revisit once a 404 counts (`next_attempt_at`,
    the window of its earlier requests), as an uncertain answer is; elsewhere by hand."""
    now = clock.now()
    fresh: list[Item] = []
    stale: list[Item] = []
    for item in window:
        (stale if deadline_passed(item, now) else fresh).append(item)
    if not stale:
        return fresh, []
    # Any earlier attempt may have reached the recipient, not only the last (a 429 after
    # a 500 proves nothing about the 500's request); the open one was never started.
    doubtful = store.queries.maybe_delivered(run_id, [item.seq for item in stale])
    outcomes: list[Outcome] = []
    for item in stale:
        uncertain = item.seq in doubtful
        again = _ask_again_at(store, run_id, item, channels, now) if uncertain else None
        outcomes.append(
            Outcome(
                item.seq,
                ItemTrigger.LOSE if uncertain else ItemTrigger.RELEASE,
                AttemptOutcome.EXPIRED,
                error=(
                    f"not_after {item.not_after} passed after an attempt that may have "
                    "been delivered; not sent again until a query or a decision by hand settles it"
                    + ("" if again is None else f"; asking again at {again}")
                    if uncertain
                    else f"not_after {item.not_after} passed before its turn: not sent"
                ),
                expected=ItemState.IN_FLIGHT,
                next_attempt_at=again,
            )
        )
    return fresh, outcomes


def _ask_again_at(
    store: Store,
    run_id: str,
    item: Item,
    channels: Mapping[str, Channel],
    now: datetime,
) -> str | None:
    """When the runner's revisit asks about a stale item that may have been delivered: once
    a 404 counts for its earlier requests (the claim being closed never left); None where
    its channel cannot be asked."""
    channel = channels.get(item.channel)
    if channel is None or not channel.queryable:
        return None
    earlier = [a for a in store.queries.attempts(run_id, item.seq) if a.finished_at is not None]
    since = not_found_counts_from(Caps.of(channel), earlier, now)
    return clock.iso(max(since, now) if since is not None else now)
