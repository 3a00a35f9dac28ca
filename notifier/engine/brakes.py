"""The run's brakes: what recorded outcomes mean for the run as a whole. A streak of unknown
outcomes halts it (check the downstream before more may be lost); a conflict halts it (another
intent writes under our keys); a channel whose requests keep failing to reach its receiver
pauses it (nothing is wrong with its items). The committer applies them to each outcome it
records, and reads them ahead to claim nothing new in a commit that will stop the run. A
brake only says so (a Brake, its cause): the committer asks the run control to stop."""

from __future__ import annotations

from collections.abc import Mapping

from notifier.domain.records import AttemptOutcome, Outcome
from notifier.domain.state_machine import ItemTrigger
from notifier.engine.judging import Progress
from notifier.engine.run_control import Brake, Stop

# How the reason of a pause for a channel that is down reads (its cause: StopCause).
CHANNEL_DOWN_PAUSE = " is down: "


class Brakes:
    """The brakes of one run, over the progress the committer keeps (judging.Progress)."""

    def __init__(self, progress: Progress, *, streak_limit: int, down_after: int) -> None:
        self.p = progress
        self.streak_limit = streak_limit
        self.down_after = down_after

    def would_halt(self, outcomes: list[Outcome], channel_of: Mapping[int, str]) -> bool:
        """Whether recording `outcomes` halts or pauses the run (`after`'s and
        `note_reach`'s rules, read ahead)."""
        streak = self.p.unknown_streak
        unreached = dict(self.p.unreached)
        for outcome in outcomes:
            if outcome.trigger == ItemTrigger.CONFLICT:
                return True
            streak = next_streak(streak, outcome)
            if streak >= self.streak_limit:
                return True
            channel = channel_of[outcome.seq]
            unreached[channel] = unreached_after(unreached.get(channel, 0), outcome)
            if unreached[channel] >= self.down_after:
                return True
        return False

    def note_reach(self, channel: str, outcome: Outcome) -> Brake | None:
        """A channel whose requests keep failing to reach its receiver (refused, DNS, TLS)
        is down: the run pauses, its items pending, none failed for it."""
        count = unreached_after(self.p.unreached.get(channel, 0), outcome)
        self.p.unreached[channel] = count
        if count >= self.down_after:
            return Brake(
                Stop.CHANNEL_DOWN,
                f"channel {channel!r}{CHANNEL_DOWN_PAUSE}{count} requests in a row could not "
                f"reach its receiver ({outcome.error})",
            )
        return None

    def after(self, outcome: Outcome) -> Brake | None:
        """Count `outcome` (progress, the unknown streak) and say what it means; the brake it
        sets off, if any."""
        if outcome.trigger == ItemTrigger.LOSE and outcome.next_attempt_at is not None:
            # Waiting for query_delay: not an unknown outcome (yet), so no streak, no advance.
            self.p.say(f"item {outcome.seq}: {outcome.error}")
            return None
        if outcome.trigger in (
            ItemTrigger.ACK,
            ItemTrigger.FOUND,
            ItemTrigger.GIVE_UP,
            ItemTrigger.CONFLICT,
            ItemTrigger.LOSE,
        ):
            self.p.advance(1)
        self.p.unknown_streak = next_streak(self.p.unknown_streak, outcome)
        if outcome.trigger == ItemTrigger.LOSE:
            self.p.say(f"item {outcome.seq}: unknown — {outcome.error}")
            if self.p.unknown_streak >= self.streak_limit:
                return Brake(
                    Stop.HALTED,
                    f"{self.p.unknown_streak} unknown outcomes in a row: check the downstream",
                )
        elif outcome.trigger in (ItemTrigger.GIVE_UP, ItemTrigger.CONFLICT):
            self.p.say(f"item {outcome.seq}: failed — {outcome.error}")
        if outcome.trigger == ItemTrigger.CONFLICT:
            # Whatever revealed it (a 422, a query, a receipt for another digest), a key held
            # by another intent means something else writes under our keys: stop, exit 4.
            return conflict(outcome)
        return None


def conflict(outcome: Outcome) -> Brake:
    """A conflict, however found (an answer, a query, a receipt for another digest)."""
    return Brake(Stop.CONFLICT, f"conflict on item {outcome.seq}: {outcome.error}")


def unreached_after(count: int, outcome: Outcome) -> int:
    """Requests of a channel in a row that could not reach its receiver, after `outcome`
    (one of that channel's): a request given back as not_sent counts, one never started
    changes nothing, any answer from the receiver starts again from zero."""
    if outcome.trigger == ItemTrigger.RELEASE:
        return count + (outcome.attempt_outcome == AttemptOutcome.NOT_SENT)
    return 0


def next_streak(streak: int, outcome: Outcome) -> int:
    """Unknown outcomes in a row after `outcome` (a query_delay wait is not one)."""
    if outcome.trigger in (ItemTrigger.ACK, ItemTrigger.FOUND):
        return 0
    if outcome.trigger == ItemTrigger.LOSE and outcome.next_attempt_at is None:
        return streak + 1
    return streak
