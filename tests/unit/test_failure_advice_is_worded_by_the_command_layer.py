"""A failure below the command line (the store, the state machine) states what to do next as
a fact (errors.NextStep); the command layer words it (outcome.error_message), and what it
prints is the whole sentence an operator reads: the failure, then the command that works."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from notifier.cli.outcome import error_message
from notifier.domain.errors import NextStep, NotifierError
from notifier.domain.records import AttemptOutcome, Outcome
from notifier.domain.state_machine import IllegalMove, ItemState, ItemTrigger, item_next
from notifier.store import LostRace
from notifier.store.core import ROLLED_BACK
from notifier.store.exceptions import DatabaseUnwritable
from notifier.store.sqlite import SqliteEngine

from ..engine.test_store_integrity import planned_store


def _nobody(owner: object, at: object) -> bool:
    return False


def _sqlite_error(code: int) -> sqlite3.Error:
    error = sqlite3.OperationalError("scripted")
    error.sqlite_errorcode = code
    return error


def test_a_lost_race_names_the_run_to_look_at(tmp_path: Path) -> None:
    store = planned_store(tmp_path / "receipts.db", 1)
    try:
        version = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, _nobody)
        store.ledger.claim("r1", version, 1)
        ack = Outcome(
            1, ItemTrigger.ACK, AttemptOutcome.SENT, receipt_id="x", receipt_source="send"
        )
        store.ledger.record("r1", version, [ack])
        late = Outcome(1, ItemTrigger.LOSE, AttemptOutcome.UNCERTAIN, expected=ItemState.IN_FLIGHT)
        with pytest.raises(LostRace) as lost:
            store.ledger.record("r1", version, [late])
    finally:
        store.close()
    assert (lost.value.then, lost.value.then_run) == (NextStep.STATUS, "r1")
    assert "notifier" not in str(lost.value)
    assert error_message(lost.value) == (
        "run r1 item 1: another process moved it first (it was no longer in_flight for lose); "
        "this process stopped without overwriting anything. `notifier status r1` shows where "
        "it stands."
    )


def test_an_illegal_move_says_look_then_run_the_command_again() -> None:
    with pytest.raises(IllegalMove) as illegal:
        item_next(ItemTrigger.ACK, ItemState.PENDING)
    said = str(illegal.value)
    assert said.endswith(
        "is not allowed from 'pending': another process or an operator changed it at the "
        "same moment; nothing was overwritten."
    )
    assert error_message(illegal.value) == (
        f"{said} `notifier status` shows where it stands now; run the command again if it "
        "still applies."
    )


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (sqlite3.SQLITE_FULL, "the disk holding receipts.db is full. {safe} Free some space "
                              "on that disk, then run `notifier resume`."),
        (sqlite3.SQLITE_IOERR, "an I/O error while writing (scripted). {safe} Check the disk "
                               "(dmesg, df), then run `notifier resume`."),
    ],
    ids=["full", "io"],
)  # fmt: skip
def test_a_storage_failure_says_resume_once_its_cause_is_fixed(
    tmp_path: Path, code: int, expected: str
) -> None:
    path = tmp_path / "receipts.db"
    engine = SqliteEngine.open(path, create=True)
    try:
        failure = engine.storage_failure(_sqlite_error(code))
    finally:
        engine.close()
    assert failure.then is NextStep.RESUME and "notifier" not in str(failure)
    assert error_message(failure) == f"{path}: " + expected.format(safe=ROLLED_BACK)


def test_an_unwritable_file_says_what_still_reads_it() -> None:
    failure = DatabaseUnwritable("r.db: cannot be written: x. Nothing was changed.").advise(
        NextStep.READ_ONLY
    )
    assert error_message(failure) == (
        "r.db: cannot be written: x. Nothing was changed. `notifier status`, `report` and "
        "`runs` still read it; to send, resume, cancel or reconcile, make it writable (or "
        "copy it somewhere writable and pass --db)."
    )


def test_a_failure_without_a_next_step_is_its_message() -> None:
    assert error_message(NotifierError("plain")) == "plain"


@pytest.mark.parametrize("step", list(NextStep))
def test_every_next_step_is_worded_after_the_failure(step: NextStep) -> None:
    """No NextStep is left without its words: the failure's own text, then a command."""
    said = error_message(NotifierError("it failed.").advise(step, "r1", ["u1"]))
    assert said.startswith("it failed") and "`notifier " in said.removeprefix("it failed.")


def test_a_cut_short_redraft_names_only_the_rows_never_asked() -> None:
    """The rows a redraft never asked for are typed ids; the command that redrafts them, and
    only them, is worded here, each id quoted for the shell."""
    cut = NotifierError("run r1: redraft interrupted (Ctrl-C): … void").advise(
        NextStep.REVIEW_REDRAFTED, "r1", ["u7", "u 8"]
    )
    assert error_message(cut) == (
        "run r1: redraft interrupted (Ctrl-C): … void: review it with `notifier preview r1`. "
        "2 row(s) were never asked and keep their draft: `notifier redraft r1 --item u7 "
        "--item 'u 8'` redrafts them."
    )
    nothing_new = NotifierError("run r1: … the fingerprint stands.").advise(
        NextStep.REDRAFT_NOT_ASKED, "r1", ["u7"]
    )
    assert error_message(nothing_new) == (
        "run r1: … the fingerprint stands. 1 row(s) were never asked and keep their draft: "
        "`notifier redraft r1 --item u7` redrafts them."
    )
