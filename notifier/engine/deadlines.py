"""An item's not_after, checked twice: when it is claimed (`split_stale`) and again right
before its send (`past_deadline`, asked by the run control's `may_start`), since an item
claimed ahead may wait past it for a free sender. Either way it is never sent late:
released, never attempted, it is expired by the next pass, or settled if an earlier attempt
may have reached the recipient."""

from __future__ import annotations

from datetime import datetime

from notifier.domain import clock
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


def split_stale(store: Store, run_id: str, window: list[Item]) -> tuple[list[Item], list[Outcome]]:
    """Claimed items whose deadline passed are not sent. One never possibly delivered
    goes back to pending, its claim not counted as an attempt (no request left), where the
    next expiry pass expires it; one that an earlier attempt may have reached becomes
    unknown, to be settled rather than expired blindly."""
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
        outcomes.append(
            Outcome(
                item.seq,
                ItemTrigger.LOSE if uncertain else ItemTrigger.RELEASE,
                AttemptOutcome.EXPIRED,
                error=(
                    f"not_after {item.not_after} passed after an attempt that may have "
                    "been delivered; not sent again until a query or a decision by hand settles it"
                    if uncertain
                    else f"not_after {item.not_after} passed before its turn: not sent"
                ),
                expected=ItemState.IN_FLIGHT,
            )
        )
    return fresh, outcomes
