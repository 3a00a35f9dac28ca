"""The state machines allow exactly the moves of docs/design.md section 3, and nothing else."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from notifier.domain.state_machine import (
    ITEM_TRANSITIONS,
    RUN_TRANSITIONS,
    IllegalMove,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
    item_next,
    item_triggers,
    run_next,
)


def _table(rows: list[tuple[str, object, object]]) -> dict[tuple[str, str], str]:
    table = {}
    for trigger, sources, dest in rows:
        for source in sources if isinstance(sources, list) else [sources]:
            table[(trigger, str(source))] = str(dest)
    return table


ITEM_TABLE = _table(ITEM_TRANSITIONS)  # type: ignore[arg-type]
RUN_TABLE = _table(RUN_TRANSITIONS)  # type: ignore[arg-type]
ITEM_TRIGGER_NAMES = sorted({t for t, _ in ITEM_TABLE})
RUN_TRIGGER_NAMES = sorted({t for t, _ in RUN_TABLE})


def test_design_table_for_items() -> None:
    """The item table is the one in the design, spelled out."""
    assert ITEM_TABLE == {
        ("start", "pending"): "in_flight",
        ("ack", "in_flight"): "sent",
        ("retry_later", "in_flight"): "pending",
        ("give_up", "in_flight"): "failed",
        ("give_up", "unknown"): "failed",
        ("lose", "in_flight"): "unknown",
        ("found", "in_flight"): "sent",
        ("found", "unknown"): "sent",
        ("not_found", "in_flight"): "pending",
        ("not_found", "unknown"): "pending",
        ("conflict", "in_flight"): "failed",
        ("conflict", "unknown"): "failed",
        ("mark_sent", "unknown"): "sent",
        ("mark_not_sent", "unknown"): "pending",
        ("abandon", "unknown"): "failed",
        ("release", "in_flight"): "pending",
        ("found", "pending"): "sent",
        ("not_found", "pending"): "pending",
        ("conflict", "pending"): "failed",
        ("doubt", "pending"): "unknown",
        # A query_delay wait whose delayed query could not decide: a plain unknown.
        ("undecided", "unknown"): "unknown",
        ("expire", "pending"): "expired",
        ("suppress", "pending"): "suppressed",
    }


def test_sent_and_failed_are_final() -> None:
    """Nothing moves an item out of sent or failed: a receipt is never undone."""
    assert item_triggers(ItemState.SENT) == []
    assert item_triggers(ItemState.FAILED) == []


@given(st.lists(st.sampled_from(ITEM_TRIGGER_NAMES), max_size=40))
def test_any_item_trigger_sequence_follows_the_table(triggers: list[str]) -> None:
    """Firing arbitrary triggers moves an item exactly as the table says, and every move
    the table lacks raises IllegalMove without changing the state."""
    state = ItemState.PENDING
    for trigger in triggers:
        expected = ITEM_TABLE.get((trigger, state.value))
        if expected is None:
            try:
                item_next(ItemTrigger(trigger), state)
            except IllegalMove:
                continue
            raise AssertionError(f"{trigger} from {state} should be illegal")
        state = item_next(ItemTrigger(trigger), state)
        assert state.value == expected


@given(st.lists(st.sampled_from(RUN_TRIGGER_NAMES), max_size=40))
def test_any_run_trigger_sequence_follows_the_table(triggers: list[str]) -> None:
    """The same for runs; completed and cancelled are final."""
    state = RunState.PLANNED
    for trigger in triggers:
        expected = RUN_TABLE.get((trigger, state.value))
        if expected is None:
            try:
                run_next(RunTrigger(trigger), state)
            except IllegalMove:
                continue
            raise AssertionError(f"{trigger} from {state} should be illegal")
        state = run_next(RunTrigger(trigger), state)
        assert state.value == expected
    if state in (RunState.COMPLETED, RunState.CANCELLED):
        for trigger in RUN_TRIGGER_NAMES:
            assert (trigger, state.value) not in RUN_TABLE
