"""Every exit code of the contract, produced through the CLI's one mapping (errors.ExitCode):
each failure class carries its code, each way a run stops maps to one code (a run whose
every item expired is 3, not 0), and a bug is an internal error without a traceback. 130
(Ctrl-C) is pinned by test_operator_control.py::test_ctrl_c_pauses_cleanly_and_resume_completes
and test_ctrl_c_while_planning_or_reconciling.py."""

from __future__ import annotations

import pytest

from notifier.api import planning
from notifier.domain.errors import ExitCode
from notifier.domain.state_machine import IllegalMove, ItemState, ItemTrigger, item_next
from notifier.engine.runner import Runner
from notifier.store import LostRace

from ..conftest import EXAMPLE, Inbox, Workspace, make_rows
from ..support.crashed import crash_send
from ..support.runs import plan_run


def test_0_done(ws: Workspace) -> None:
    """A batch sent completely exits 0."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == ExitCode.DONE


def test_1_internal_error_without_traceback(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (any exception that is not a NotifierError) exits 1 with a message that says
    nothing was lost, and no traceback."""

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(planning, "plan_batch", broken)
    result = ws.invoke("send", str(EXAMPLE))
    assert result.exit_code == ExitCode.INTERNAL
    assert "internal error: ZeroDivisionError: a bug. Nothing was lost" in result.output
    assert "Traceback" not in result.output


def test_2_bad_input(ws: Workspace) -> None:
    """A file with a problem exits 2 and stores nothing."""
    (ws.path / "bad.csv").write_text("to,subject\n,Hi\n")
    assert ws.invoke("send", "bad.csv").exit_code == ExitCode.BAD_INPUT
    assert not ws.db_file.exists()


def test_3_items_need_attention(ws: Workspace, inbox: Inbox) -> None:
    """An SMTP item whose outcome is unknown after a crash leaves the resume at exit 3."""
    ws.write_csv("batch.csv", make_rows(3))
    crash_send("after-send:2", db=ws.db, channel="mail")
    resumed = ws.invoke("resume")
    assert resumed.exit_code == ExitCode.ATTENTION, resumed.output
    assert "reconcile --manual" in resumed.output


@pytest.mark.parametrize(
    "race",
    [
        LostRace("run r item 3: another process moved it first; nothing was overwritten"),
        pytest.param(None, id="illegal-move"),
    ],
    ids=["lost-race", "illegal-move"],
)
def test_4_a_lost_race_or_illegal_move_is_refused_not_internal(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, race: Exception | None
) -> None:
    """A conditional UPDATE that lost its race, or a move the state machine forbids, reaches
    the operator as refused for safety (exit 4) with its explanation, never 'internal error'."""
    if race is None:
        try:
            item_next(ItemTrigger.ACK, ItemState.PENDING)
        except IllegalMove as exc:
            race = exc
    assert race is not None
    raised = race

    def lose(self: Runner) -> None:
        raise raised

    monkeypatch.setattr(Runner, "run", lose)
    result = ws.invoke("send", str(EXAMPLE))
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "internal error" not in result.output
    assert str(raised) in result.output


@pytest.mark.parametrize(
    "look",
    [
        ["report", "--format", "csv"],
        ["status", "--json"],
        ["preview", "--format", "jsonl"],
        ["preview", "--format", "csv"],
    ],
    ids=" ".join,
)
def test_a_reader_that_stops_early_ends_a_look_quietly(ws: Workspace, look: list[str]) -> None:
    """`notifier report --format csv | head -1`: when the reader closes the pipe, a command
    that only looks exits 0 with nothing on stderr: no "internal error", no traceback, not
    even one Python prints as "Exception ignored" for a read cut short (preview)."""
    # A report of several pipe buffers (some 370 kB): a run of 2,000 planned items is as long
    # a look as a sent one, without sending them one by one first (a minute on a busy CI).
    plan_run(ws, make_rows(2_000))
    reader = ws.popen(*look)
    assert reader.stdout is not None
    assert reader.stdout.readline()
    reader.stdout.close()  # as `head -1` does once it has its line
    _, stderr = reader.communicate(timeout=60)
    assert (reader.returncode, stderr) == (0, "")


@pytest.mark.both_stores
def test_a_run_whose_items_expired_exits_3_not_0(ws: Workspace) -> None:
    """A send whose every item expired (never sent) exits 3 and says so, not 0."""
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--not-after", "2020-01-01T00:00:00Z", "--allow-expired")
    assert result.exit_code == 3, result.output
    assert "2 expired" in result.output
    assert ws.outbox_documents() == []
    assert ws.status()["counts"]["expired"] == 2
