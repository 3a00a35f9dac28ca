"""What a run's ending advises for its unknown items (cli/outcome.unknown_advice): those
that only wait for their query window go to a plain `reconcile` once it has passed, never to
a manual mark (the receiver may still commit them: marked not sent, they would go out twice
to a recipient who got them); only the others to `reconcile --manual`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from notifier.cli.outcome import run_advice
from notifier.domain import clock
from notifier.domain.records import Counts
from notifier.domain.state_machine import RunState
from notifier.engine.run_control import Stop
from notifier.engine.runner import RunResult

WINDOW_ENDS = datetime(2026, 12, 6, 18, 0, 3, tzinfo=UTC)
ENDINGS = pytest.mark.parametrize(
    ("state", "stop"),
    [(RunState.CANCELLED, Stop.CANCELLED), (RunState.PAUSED, Stop.UNKNOWN_LEFT)],
)


def _ended(
    state: RunState, stop: Stop, unknown: int, later: int | None, marks_from: datetime | None = None
) -> RunResult:
    counts = Counts(unknown=unknown, pending=2)
    settle_later = (later, WINDOW_ENDS) if later is not None else None
    return RunResult(state, stop, "ended", counts, settle_later=settle_later, marks_from=marks_from)


@ENDINGS
def test_items_waiting_for_their_window_go_to_a_plain_reconcile(
    state: RunState, stop: Stop
) -> None:
    advice = run_advice(_ended(state, stop, unknown=3, later=3), "r1", "again")
    assert "a plain `notifier reconcile r1` then settles them" in advice
    assert "3 unknown item(s) wait for the receiver's window" in advice
    assert "--manual" not in advice


@ENDINGS
def test_only_the_items_no_query_can_settle_go_to_a_manual_mark(
    state: RunState, stop: Stop
) -> None:
    advice = run_advice(_ended(state, stop, unknown=3, later=1), "r1", "again")
    assert "1 unknown item(s) wait for the receiver's window" in advice
    assert "Settle the other unknown items with `notifier reconcile --manual r1`." in advice


@ENDINGS
def test_with_no_window_to_wait_for_a_person_settles_them(state: RunState, stop: Stop) -> None:
    advice = run_advice(_ended(state, stop, unknown=2, later=None), "r1", "again")
    assert advice == "Settle the unknown items with `notifier reconcile --manual r1`."


@ENDINGS
def test_a_manual_mark_not_taken_yet_is_advised_with_the_moment_it_is(
    state: RunState, stop: Stop
) -> None:
    """Items no query settles, whose receiver may still commit them: the advice names the
    moment a not-sent mark is taken (api/settling refuses it before)."""
    advice = run_advice(_ended(state, stop, unknown=2, later=None, marks_from=WINDOW_ENDS),
                        "r1", "again")  # fmt: skip
    assert advice == (
        "Settle the unknown items with `notifier reconcile --manual r1` from "
        f"{clock.local(clock.iso(WINDOW_ENDS))}, when the receiver can no longer commit them "
        "(a not-sent mark is refused before then)."
    )
