"""From how a command ended to the contract's exit code and the advice to print: the one
table, used only by the command line. The layers below return states, reasons and counts."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from notifier.domain import clock
from notifier.domain.errors import ExitCode, NextStep, NotifierError
from notifier.domain.records import Counts
from notifier.domain.state_machine import RunState
from notifier.engine.run_control import Stop
from notifier.engine.runner import RunResult

# The `send` options that shape a run (where, what, whether reviewed, when), as stored in its
# options: the command that sends its file again must repeat them, or it plans another run.
_SHAPING = (
    ("channel", "--channel"),
    ("template_path", "--template"),
    ("not_after", "--not-after"),
    ("not_before", "--not-before"),
    ("tz", "--tz"),
    ("window", "--window"),
)
_SHAPING_FLAGS = (
    ("require_approval", "--require-approval"),
    ("allow_duplicates", "--allow-duplicates"),
)


def send_again(batch: str, options: Mapping[str, Any]) -> str:
    """The `notifier send` command that plans `batch` again as the run with these options
    was planned: the same channel, template, brief and model, approval and schedule."""
    words = ["notifier", "send", batch]
    for key, flag in _SHAPING:
        if options.get(key) is not None:
            words += [flag, str(options[key])]
    # A composed run: drafted again with the same brief, model and columns (sent without
    # --compose, its rows would carry the file's text, not the drafts delivered, and be
    # refused as changed). A run stored without its brief's path names the option's value.
    compose = options.get("compose")
    if isinstance(compose, Mapping):
        words += ["--compose", str(options.get("compose_path") or "BRIEF")]
        words += ["--model", str(compose["model"])]
        if compose.get("columns") is not None:
            words += ["--compose-columns", ",".join(compose["columns"])]
    words += [flag for key, flag in _SHAPING_FLAGS if options.get(key)]
    return shlex.join(words)


def settled_exit(state: RunState, counts: Counts) -> ExitCode:
    """3 while some item needs attention (unknown, failed, or expired: its not_after passed
    and it was never sent; in a cancelled run, also any item that will now never be sent),
    else 0 — so `notifier send … && echo delivered` never lies. A suppressed item needs
    no attention: not sending it is what the operator asked for. The same rule for `send`,
    `resume`, `cancel`, `reconcile` and the worker a cancel stopped, so one outcome never
    gets two codes."""
    if state is RunState.CANCELLED:
        done = counts.sent + counts.suppressed
        return ExitCode.DONE if counts.total == done else ExitCode.ATTENTION
    needs_attention = counts.unknown or counts.failed or counts.expired
    return ExitCode.ATTENTION if needs_attention else ExitCode.DONE


def run_exit(result: RunResult) -> ExitCode:
    """The exit code of a `send` or `resume` that ran to a stop."""
    if result.stop is Stop.INTERRUPTED:
        return ExitCode.INTERRUPTED
    if result.stop is Stop.TERMINATED:
        return ExitCode.TERMINATED
    if result.stop in (Stop.CONFLICT, Stop.APPROVAL_EXPIRED):
        return ExitCode.REFUSED
    if result.stop in (Stop.UNKNOWN_LEFT, Stop.RATE_LIMITED, Stop.HALTED, Stop.CHANNEL_DOWN):
        return ExitCode.ATTENTION
    if result.stop is Stop.LEFT:
        # Stopped, not done: this worker left a run that is not finished (other live
        # workers are still sending it, or another worker's interruption paused it). 0 is
        # kept for every item sent: the worker that finishes the run exits 0.
        return ExitCode.ATTENTION
    return settled_exit(result.state, result.counts)


def renew_approval(run_id: str) -> str:
    """How a run whose approval expired is approved again and goes on (a clause)."""
    return (
        f"review every notification with `notifier preview {run_id}`, then `notifier approve "
        f"{run_id} --fingerprint sha256:…` with the fingerprint on its last line, then "
        f"`notifier resume {run_id}`"
    )


def run_advice(result: RunResult, run_id: str, again: str) -> str:
    """What to do next, if anything, after a run stopped. `again`: the command that sends
    the run's file again (send_again), which delivers what the run did not, nothing twice."""
    # A worker that left a run another worker's interruption paused: as if interrupted.
    # (Not one the other workers finished meanwhile: the run was being sent when it left.)
    left_paused = result.stop is Stop.LEFT and result.state is RunState.PAUSED
    if result.stop in (Stop.INTERRUPTED, Stop.TERMINATED) or left_paused:
        return f"Continue with `notifier resume {run_id}`."
    if result.stop is Stop.APPROVAL_EXPIRED:
        return f"The approval expired: {renew_approval(run_id)} goes on."
    if result.stop is Stop.RATE_LIMITED:
        return f"Run `notifier resume {run_id}` after that time."
    if result.stop is Stop.CHANNEL_DOWN:
        return (
            f"No item failed for it: they wait as pending. Once the receiver answers again, "
            f"`notifier resume {run_id}` continues."
        )
    if result.stop is Stop.UNKNOWN_LEFT:
        return unknown_advice(run_id, result.counts.unknown, result.settle_later, result.marks_from)
    if result.stop in (Stop.HALTED, Stop.CONFLICT):
        advice = (
            f"`notifier status {run_id}` lists the items; fix the cause, then "
            f"`notifier resume {run_id}`. Once the run is finished, send the same file again "
            f"(`{again}`) to retry the items that failed: only rows never delivered are sent."
        )
        if result.counts.unknown:
            # `reconcile` by query settles nothing on a channel that cannot be asked.
            advice += (
                f" The {result.counts.unknown} unknown item(s): `notifier reconcile {run_id}` "
                f"asks the receiver where it can be asked; where it cannot (SMTP, Apprise, a "
                f"webhook without a status_url), "
                f"`notifier reconcile --manual {run_id}`."
            )
        return advice
    if result.stop is Stop.ALREADY_FINISHED:
        return f"`notifier report {run_id}` shows the run."
    if result.stop is Stop.LEFT:
        return (
            f"The run is still being sent by the other live workers; follow it with "
            f"`notifier status {run_id}`."
        )
    if result.counts.unknown:
        return unknown_advice(run_id, result.counts.unknown, result.settle_later, result.marks_from)
    if result.counts.failed:
        return (
            f"{result.counts.failed} item(s) failed; `notifier report {run_id}` lists them "
            f"with their errors. Fix the cause, then send the same file again (`{again}`): "
            "only the rows not delivered are sent, each once."
        )
    if result.counts.expired:
        return (
            f"{result.counts.expired} item(s) passed their not_after and were never sent; "
            f"`notifier report {run_id}` lists them."
        )
    return ""


def unknown_advice(
    run_id: str,
    unknown: int,
    later: tuple[int, datetime] | None,
    marks_from: datetime | None = None,
) -> str:
    """How a run's `unknown` items get settled, after a run or a cancel: those that only
    wait for their query window (`later`: how many, and when the last window passes) by a
    plain `reconcile` once it has passed (the receiver may still commit them until then:
    marked not sent by hand, they would go out twice); the others by a person, from
    `marks_from` where a not-sent mark is not taken yet (the same reason)."""
    by_query = later[0] if later is not None else 0
    advice = []
    if later is not None:
        advice.append(
            f"{by_query} unknown item(s) wait for the receiver's window, which passes at "
            f"{clock.local(clock.iso(later[1]))}: a plain `notifier reconcile {run_id}` then "
            "settles them by query (sent, or never delivered)."
        )
    if unknown > by_query:
        others = "the other unknown items" if later is not None else "the unknown items"
        when = (
            ""
            if marks_from is None
            else f" from {clock.local(clock.iso(marks_from))}, when the receiver can no longer "
            "commit them (a not-sent mark is refused before then)"
        )
        advice.append(f"Settle {others} with `notifier reconcile --manual {run_id}`{when}.")
    return " ".join(advice)


# The commands that send a run: what a failure cut short in one of them, `resume` goes on
# with. Any other command (a `cancel`, a `reconcile`, an `approve`) failed to record what it
# was asked to do: it is that command that is run again, never `resume`, which would send
# the run (a cancel that could not be written, followed by a resume, sends every row the
# operator was cancelling).
SENDING_COMMANDS = frozenset({"send", "resume", "worker"})


def error_message(exc: NotifierError, command: str | None = None) -> str:
    """A failure's message as printed: with its next step (errors.NextStep) worded.
    `command`: the subcommand that failed, where the next step depends on it."""
    run = f" {exc.then_run}" if exc.then_run else ""
    if exc.then is NextStep.RESUME and command is not None and command not in SENDING_COMMANDS:
        return f"{exc}, then run the same command again: what it was doing was not recorded."
    if exc.then is NextStep.STATUS:
        return f"{exc} `notifier status{run}` shows where it stands."
    if exc.then is NextStep.STATUS_AND_AGAIN:
        return (
            f"{exc} `notifier status{run}` shows where it stands now; run the command again if "
            "it still applies."
        )
    if exc.then is NextStep.RESUME:
        return f"{exc}, then run `notifier resume{run}`."
    if exc.then is NextStep.READ_ONLY:
        return (
            f"{exc} `notifier status`, `report` and `runs` still read it; to send, resume, "
            "cancel or reconcile, make it writable (or copy it somewhere writable and pass "
            "--db)."
        )
    if exc.then is NextStep.VERIFY:
        return f"{exc} `notifier verify{run}` names every change."
    if exc.then is NextStep.LIST_PENDING:
        return f"{exc} `notifier report{run} --state pending` lists them."
    if exc.then is NextStep.LIST_UNKNOWN:
        return f"{exc} `notifier report{run} --state unknown` lists its unknown items by id."
    if exc.then is NextStep.SEND_FIRST:
        return (
            f"{exc} Run `notifier send BATCH.csv` first, or point --db (or NOTIFIER_DB) at an "
            "existing receipts database."
        )
    if exc.then is NextStep.REVIEW_REDRAFTED:
        return f"{exc}: review it with `notifier preview{run}`.{_not_asked(exc)}"
    if exc.then is NextStep.REDRAFT_NOT_ASKED:
        return f"{exc}{_not_asked(exc)}"
    if exc.then is NextStep.SETTLE_THEN_SEND_AGAIN:
        return f"{exc} {_settle_each(exc.then_runs or (exc.then_run or 'RUN',))}"
    advice = _ADVICE.get(exc.then) if exc.then is not None else None
    return str(exc) if advice is None else advice(str(exc), exc.then_run or "RUN")


def _settle_each(runs: Sequence[str]) -> str:
    """How the unsettled rows of each of `runs` are settled, then the file sent again: a
    plain reconcile first, which settles by query what a query can (rows left in flight
    too, which --manual, for unknown items only, never settles); --manual for the rest."""
    steps = "; then ".join(
        f"`notifier reconcile {rid}` (it asks the channels), then `notifier reconcile "
        f"--manual {rid}` for any no query can settle"
        for rid in runs
    )
    return f"Settle them with {steps}, then send the file again."


def _not_asked(exc: NotifierError) -> str:
    """The rows a redraft cut short never asked for (its `then_items`), and the redraft that
    asks for those and only those."""
    if not exc.then_items:
        return ""
    items = " ".join(f"--item {shlex.quote(item)}" for item in exc.then_items)
    return (
        f" {len(exc.then_items)} row(s) were never asked and keep their draft: `notifier "
        f"redraft {exc.then_run or 'RUN'} {items}` redrafts them."
    )


# How each next step below is said after the failure's own text (`said`) about run `rid`.
_ADVICE: dict[NextStep, Callable[[str, str], str]] = {
    NextStep.LIST_RUNS: lambda said, rid: f"{said} `notifier runs` lists the runs.",
    NextStep.READ_AGAIN: lambda said, rid: (
        f"{said} Run the same command again: it reads the file as it is now (while another "
        "process, a `notifier send` say, still has it open, under SQLite's locks: one moment)."
    ),
    NextStep.REPORT: lambda said, rid: f"{said} `notifier report {rid}` shows the run.",
    NextStep.SETTLE_IN_FLIGHT_FIRST: lambda said, rid: (
        f"{said} Its request may have reached the receiver: `notifier reconcile {rid}` "
        "settles it first by asking the receiver under its key (sent, or never delivered), "
        "sending nothing; where no query can tell, it becomes unknown, and `notifier "
        f"reconcile --manual {rid}` then takes your mark."
    ),
    NextStep.REVIEW_THEN_APPROVE: lambda said, rid: (
        f"{said} Review it again with `notifier status`, then approve."
    ),
    NextStep.FIND_RUN_TO_APPROVE: lambda said, rid: (
        f"{said} `notifier runs` lists the runs; `notifier preview RUN` shows a run's "
        "notifications with its fingerprint on the last line, and `notifier approve RUN "
        "--fingerprint sha256:…` approves that run."
    ),
    NextStep.APPROVE_NAMED: lambda said, rid: (
        f"{said} Name it: `notifier approve {rid} --fingerprint sha256:…`."
    ),
    NextStep.CANCEL_INSTEAD: lambda said, rid: f"{said}; `notifier cancel {rid}` stops it instead.",
    NextStep.SEND_AGAIN: lambda said, rid: (
        f"{said}, then run the same `notifier send` again: nothing of its plan was stored (a "
        "`resume` would go on with another, older run)."
    ),
    NextStep.REJECT_NAMED: lambda said, rid: (
        f"{said} Name the run to reject: `notifier reject {rid} --reason TEXT`."
    ),
    NextStep.FOLLOW_HOLDER: lambda said, rid: (
        f"{said} Follow it with `notifier status {rid}`; once it has finished or stopped, "
        f"`notifier resume {rid}` continues whatever it left. To stop it now: `notifier cancel "
        f"{rid}`."
    ),
    NextStep.AGAIN_ONCE_HOLDER_STOPS: lambda said, rid: (
        f"{said} Follow it with `notifier status {rid}`; once it has finished or stopped, "
        "run the same command again."
    ),
    NextStep.FOLLOW_THEN_SEND_AGAIN: lambda said, rid: (
        f"{said} Follow it with `notifier status {rid}`; once it is done, send the file again "
        "to send what it did not deliver."
    ),
    NextStep.RESUME_OR_CANCEL_THEN_SEND_AGAIN: lambda said, rid: (
        f"{said} Continue that run with `notifier resume {rid}` (or stop it with `notifier "
        f"cancel {rid}`), then send the file again to send what it did not deliver."
    ),
    NextStep.APPROVE_OR_REJECT_THEN_SEND_AGAIN: lambda said, rid: (
        f"{said} Review it with `notifier preview {rid}` (its fingerprint on the last line) "
        f"and approve it with `notifier approve {rid} --fingerprint sha256:…`; then `notifier "
        f"resume {rid}` sends it. Or close it with `notifier reject {rid} --reason TEXT`, then "
        "send the file again: its rows need approval again."
    ),
    NextStep.CANCEL_THEN_SEND_AGAIN: lambda said, rid: (
        f"{said} Close it with `notifier cancel {rid}`, then send the file again: only rows "
        "never delivered are sent."
    ),
    NextStep.RESUME_LATER_TO_DRAFT: lambda said, rid: (
        f"{said} Run `notifier resume {rid}` later to draft the rest."
    ),
    NextStep.RESUME_TO_APPROVE: lambda said, rid: (
        f"{said}: run `notifier resume {rid}` to finish the drafts and print the preview."
    ),
    NextStep.RESUME_TO_PREVIEW: lambda said, rid: (
        f"{said}: run `notifier resume {rid}` to finish the drafts, then preview it."
    ),
    NextStep.EXAMPLE_TZ: lambda said, rid: (
        f"{said}; e.g. `notifier send batch.csv --tz Europe/Paris`."
    ),
    NextStep.EXAMPLE_WINDOW: lambda said, rid: (
        f'{said}; e.g. `notifier send batch.csv --window "Mon-Fri 09:00-18:00"`.'
    ),
    NextStep.CANCEL_AND_SEND_AGAIN: lambda said, rid: (
        f"{said} To change its notifications, cancel it (`notifier cancel {rid}`), change the "
        "CSV or the template, and send the file again with --require-approval: rows "
        "delivered before are left out."
    ),
    NextStep.RESUME_DRAFTING_FIRST: lambda said, rid: (
        f"{said}: it is still drafting; `notifier resume {rid}` finishes the drafts (and, "
        "planned with --require-approval, stops for approval: redraft applies then)."
    ),
    NextStep.CANCEL_AND_COMPOSE_AGAIN: lambda said, rid: (
        f"{said}: it is already approved, and a redraft would change what was approved; to "
        f"change it, `notifier cancel {rid}` and plan its file again (`notifier send "
        "BATCH.csv --compose BRIEF --require-approval`: rows delivered before are left out)."
    ),
    NextStep.STATUS_NOT_REDRAFTABLE: lambda said, rid: (
        f"{said}: only a run awaiting approval has sent nothing, so only its drafts may "
        f"change; `notifier status {rid}` shows where it stands."
    ),
    NextStep.NAME_ROWS: lambda said, rid: (
        f"{said} Name each row to redraft with --item ID (`notifier preview {rid} --format "
        "csv` lists them)."
    ),
    NextStep.LIST_ROW_IDS: lambda said, rid: (
        f"{said} `notifier preview {rid} --format csv` lists its rows' ids; run `notifier "
        f"redraft {rid} --item ID` with ids from there."
    ),
    NextStep.REDRAFT_AGAIN: lambda said, rid: (
        f"{said} Run `notifier redraft {rid} --item ID` again once the cause above is fixed."
    ),
    NextStep.FIX_KEY_THEN_RESUME: lambda said, rid: (
        f"{said} Fix the key, then run `notifier resume {rid}` to draft the rest."
    ),
    NextStep.RESUME_WITH_MODEL: lambda said, rid: (
        f"{said} `notifier resume {rid} --model NAME` drafts the rows left with another model."
    ),
    NextStep.RESUME_DRAFTING: lambda said, rid: f"{said} Run `notifier resume {rid}` to go on.",
    NextStep.RESUME_ASKS_FIRST: lambda said, rid: (
        f"{said} Run `notifier resume {rid}` to go on: it asks which batch is the chunk's "
        "before creating one."
    ),
    NextStep.RESUME_READS_AGAIN: lambda said, rid: (
        f"{said} Run `notifier resume {rid}` to read them again."
    ),
    NextStep.RESUME_DRAFTS_REST: lambda said, rid: (
        f"{said} `notifier resume {rid}` drafts the rest without asking again for any draft kept."
    ),
    NextStep.RESUME_READS_BATCHES: lambda said, rid: (
        f"{said} `notifier resume {rid}` reads their results without creating them again; "
        f"`notifier cancel {rid}` cancels them instead."
    ),
    NextStep.REDRAFT_INSTEAD: lambda said, rid: (
        f"{said} `notifier redraft {rid} --item ID` redrafts rows of a run awaiting approval."
    ),
    NextStep.CANCEL_AGAIN: lambda said, rid: (
        f"{said} Run `notifier cancel {rid}` again once the API can be reached."
    ),
}
