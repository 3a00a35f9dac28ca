"""A storage failure (a full disk, a server gone) says what to run once the cause is fixed.
Where a run was sending, that is `notifier resume RUN`, naming it: a plain `notifier resume`
takes the newest unfinished run, which may be another. Where the failure came while a
`send` stored its plan, the plan's transaction rolled back whole and no run exists: the
advice is the same `send` again, never a `resume`, which would send whichever older run is
unfinished (one its operator paused, say)."""

from __future__ import annotations

from typing import Any

import pytest

from notifier.domain.errors import NextStep
from notifier.engine.runner import Runner
from notifier.store.exceptions import StorageFailed
from notifier.store.plans import Planning

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


def _full(*args: Any, **kwargs: Any) -> Any:
    raise StorageFailed("receipts.db: the disk holding it is full").advise(NextStep.RESUME)


def _older_paused_run(ws: Workspace) -> str:
    """A run its operator paused on purpose (a start time a day away, --max-wait 1)."""
    ws.write_csv("old.csv", make_rows(2))
    paused = ws.invoke("send", "old.csv", "--not-before", "2099-01-01T00:00:00Z", "--max-wait", "1")
    assert paused.exit_code == 3, paused.output
    return str(ws.status()["run_id"])


def test_a_plan_that_could_not_be_stored_is_sent_again_never_resumed(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = _older_paused_run(ws)
    create_run = Planning.create_run
    monkeypatch.setattr(Planning, "create_run", _full)
    ws.write_csv("new.csv", make_rows(3, start=10))
    failed = ws.invoke("send", "new.csv")
    assert failed.exit_code == 3, failed.output
    assert "`notifier resume" not in failed.output, failed.output
    assert "run the same `notifier send` again" in failed.output, failed.output
    assert ws.status()["run_id"] == older  # nothing of the new plan was stored
    # Followed once the disk has room: the same send plans and sends the new rows, each
    # once, and the run its operator paused stays paused, nothing of it sent.
    monkeypatch.setattr(Planning, "create_run", create_run)
    again = ws.invoke("send", "new.csv")
    assert again.exit_code == 0, again.output
    assert ws.ledger.state_counts(older) == {"pending": 2}
    attempts = ws.ledger.attempts()
    assert len(attempts) == 3 and len({(a.run_id, a.seq) for a in attempts}) == 3, attempts


def test_a_run_that_met_a_storage_failure_is_resumed_by_its_id(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    _older_paused_run(ws)
    monkeypatch.setattr(Runner, "run", _full)
    ws.write_csv("new.csv", make_rows(3, start=10))
    failed = ws.invoke("send", "new.csv", "--run-id", "weekly")
    assert failed.exit_code == 3, failed.output
    assert "`notifier resume weekly`" in failed.output, failed.output
