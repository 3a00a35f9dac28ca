"""The two state machines of a run and its items, built with `transitions`.

The database holds the state; these machines only decide which moves are legal. Each move is
looked up here, then persisted by the store package with a conditional UPDATE (`WHERE state =
:expected`), so a move that lost a race fails loudly instead of overwriting.
"""

from __future__ import annotations

from enum import StrEnum

from transitions import Machine

from notifier.domain.errors import NextStep, Refused


class ItemState(StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    SENT = "sent"
    UNKNOWN = "unknown"
    FAILED = "failed"
    EXPIRED = "expired"  # its not_after passed before its turn came: never sent
    # Its recipient is on the suppression list (notifier/domain/suppression.py): never sent, and not
    # a failure either: the operator (or the relay's permanent rejection) asked for it.
    SUPPRESSED = "suppressed"


class RunState(StrEnum):
    PLANNED = "planned"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class ItemTrigger(StrEnum):
    """Every move an item can make (docs/design.md section 3); the table below says from where."""

    START = "start"
    ACK = "ack"
    RETRY_LATER = "retry_later"
    GIVE_UP = "give_up"
    LOSE = "lose"
    RELEASE = "release"
    FOUND = "found"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    DOUBT = "doubt"
    UNDECIDED = "undecided"
    MARK_SENT = "mark_sent"
    MARK_NOT_SENT = "mark_not_sent"
    ABANDON = "abandon"
    EXPIRE = "expire"
    SUPPRESS = "suppress"


class RunTrigger(StrEnum):
    """Every move a run can make."""

    REQUEST_APPROVAL = "request_approval"
    APPROVE = "approve"
    START = "start"
    PAUSE = "pause"
    RESUME = "resume"
    HALT = "halt"
    COMPLETE = "complete"
    CANCEL = "cancel"
    REJECT = "reject"


# States in which an item still needs work: the partial index in the store covers exactly these.
ACTIVE_ITEM_STATES = (ItemState.PENDING, ItemState.IN_FLIGHT, ItemState.UNKNOWN)
TERMINAL_ITEM_STATES = (
    ItemState.SENT,
    ItemState.FAILED,
    ItemState.EXPIRED,
    ItemState.SUPPRESSED,
)
FINISHED_RUN_STATES = (RunState.COMPLETED, RunState.CANCELLED)

_I = ItemState
_T = ItemTrigger
ITEM_TRANSITIONS = [
    (_T.START, _I.PENDING, _I.IN_FLIGHT),
    (_T.ACK, _I.IN_FLIGHT, _I.SENT),
    (_T.RETRY_LATER, _I.IN_FLIGHT, _I.PENDING),
    # From unknown: an item that waited for its query_delay, proven undelivered, attempts spent.
    (_T.GIVE_UP, [_I.IN_FLIGHT, _I.UNKNOWN], _I.FAILED),
    (_T.LOSE, _I.IN_FLIGHT, _I.UNKNOWN),
    # Claimed but never started (a cancel seen right before the send): never attempted.
    (_T.RELEASE, _I.IN_FLIGHT, _I.PENDING),
    # Pending items whose last attempt may have been delivered (waiting to retry on a channel
    # that dedupes) are settled by `cancel`: by query where possible, else they become unknown.
    (_T.FOUND, [_I.IN_FLIGHT, _I.UNKNOWN, _I.PENDING], _I.SENT),
    (_T.NOT_FOUND, [_I.IN_FLIGHT, _I.UNKNOWN, _I.PENDING], _I.PENDING),
    (_T.CONFLICT, [_I.IN_FLIGHT, _I.UNKNOWN, _I.PENDING], _I.FAILED),
    (_T.DOUBT, _I.PENDING, _I.UNKNOWN),
    # An unknown item waiting for its query_delay whose delayed query could not decide either
    # way: it stays unknown, but nothing revisits it any more (manual reconcile settles it).
    (_T.UNDECIDED, _I.UNKNOWN, _I.UNKNOWN),
    (_T.MARK_SENT, _I.UNKNOWN, _I.SENT),
    (_T.MARK_NOT_SENT, _I.UNKNOWN, _I.PENDING),
    (_T.ABANDON, _I.UNKNOWN, _I.FAILED),
    # Only from pending: an item whose last attempt may have been delivered is settled
    # first (store.ledger.expire_due leaves it to the runner), never expired blindly.
    (_T.EXPIRE, _I.PENDING, _I.EXPIRED),
    # Only from pending, like EXPIRE: at plan time (the row was stored pending in the same
    # transaction) and at the claim, before the send starts. A claimed item (in_flight) may
    # already be on its way to the relay: it is sent and recorded as it turns out.
    (_T.SUPPRESS, _I.PENDING, _I.SUPPRESSED),
]

_R = RunState
_RT = RunTrigger
RUN_TRANSITIONS = [
    (_RT.REQUEST_APPROVAL, _R.PLANNED, _R.AWAITING_APPROVAL),
    (_RT.APPROVE, _R.AWAITING_APPROVAL, _R.APPROVED),
    (_RT.START, [_R.PLANNED, _R.APPROVED], _R.RUNNING),
    (_RT.PAUSE, _R.RUNNING, _R.PAUSED),
    (_RT.RESUME, [_R.PAUSED, _R.HALTED], _R.RUNNING),
    (_RT.HALT, _R.RUNNING, _R.HALTED),
    (_RT.COMPLETE, [_R.RUNNING, _R.PAUSED, _R.HALTED], _R.COMPLETED),
    (
        _RT.CANCEL,
        [_R.PLANNED, _R.AWAITING_APPROVAL, _R.APPROVED, _R.RUNNING, _R.PAUSED, _R.HALTED],
        _R.CANCELLED,
    ),
    # `notifier reject`: the reviewer closes a run nobody approved; nothing was ever sent.
    (_RT.REJECT, _R.AWAITING_APPROVAL, _R.CANCELLED),
]


class IllegalMove(Refused):
    """A trigger was fired from a state that does not allow it: something else moved the row
    (another process, an operator) between our read and our write. Refused, never forced."""


def _machine(states: type[StrEnum], table: list[tuple[str, object, object]]) -> Machine:
    transitions = [{"trigger": str(t), "source": src, "dest": dst} for t, src, dst in table]
    return Machine(
        model=None,
        states=states,
        transitions=transitions,
        initial=next(iter(states)),
        auto_transitions=False,
    )


_ITEM_MACHINE = _machine(ItemState, ITEM_TRANSITIONS)  # type: ignore[arg-type]
_RUN_MACHINE = _machine(RunState, RUN_TRANSITIONS)  # type: ignore[arg-type]


def _moves(
    machine: Machine, states: type[StrEnum], triggers: type[StrEnum]
) -> dict[tuple[str, str], str]:
    """Every (trigger, state) the machine allows and the state it leads to, asked of the
    machine once: a move is then one dict lookup, on the path of every item sent."""
    moves = {}
    for trigger in triggers:
        for state in states:
            found = machine.get_transitions(trigger=str(trigger), source=state.name)
            if found:
                moves[(str(trigger), state.value)] = states[str(found[0].dest)].value
    return moves


_ITEM_MOVES = _moves(_ITEM_MACHINE, ItemState, ItemTrigger)
_RUN_MOVES = _moves(_RUN_MACHINE, RunState, RunTrigger)


def _next(moves: dict[tuple[str, str], str], trigger: str, current: StrEnum) -> str:
    found = moves.get((trigger, current.value))
    if found is None:
        raise IllegalMove(
            f"{trigger!r} is not allowed from {current.value!r}: another process or an operator "
            "changed it at the same moment; nothing was overwritten."
        ).advise(NextStep.STATUS_AND_AGAIN)
    return found


def item_target(trigger: str, current: str) -> str | None:
    """`item_next` by value, None for a move not allowed: for replay, which reads the
    trigger and the state as text and names a move not allowed rather than refusing it."""
    return _ITEM_MOVES.get((trigger, current))


def item_next(trigger: ItemTrigger, current: ItemState) -> ItemState:
    """The state an item moves to when `trigger` fires in `current`, or IllegalMove."""
    return ItemState(_next(_ITEM_MOVES, trigger, current))


def run_next(trigger: RunTrigger, current: RunState) -> RunState:
    """The state a run moves to when `trigger` fires in `current`, or IllegalMove."""
    return RunState(_next(_RUN_MOVES, trigger, current))


def item_triggers(current: ItemState) -> list[str]:
    return list(_ITEM_MACHINE.get_triggers(current.name))
