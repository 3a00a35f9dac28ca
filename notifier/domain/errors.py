"""One error model: every failure an operator can act on is a `NotifierError` carrying its exit
code from the one `ExitCode` table of the CLI contract (docs/design.md section 7). The click
group (cli/group.py) turns it into the exit status in exactly one place; nothing else
decides exit codes for errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum, StrEnum
from typing import ClassVar, Self


class ExitCode(IntEnum):
    DONE = 0
    INTERNAL = 1  # a bug: nothing is lost, every state change is durable
    BAD_INPUT = 2  # usage or bad input; nothing was changed
    ATTENTION = 3  # stopped with items needing attention, or paused
    REFUSED = 4  # refused for safety: live lease, conflict, failed check, approval
    ALTERED = 5  # `verify`: a run's events or rows were altered after they were written
    INTERRUPTED = 130  # Ctrl-C: the run was paused cleanly
    TERMINATED = 143  # SIGTERM (systemd, docker stop): the run was paused cleanly
    CRASHED = 137  # NOTIFIER_CRASH_AT: a simulated crash


class NextStep(StrEnum):
    """What the operator can do next after a failure, as a fact: the layers below the
    command line state it, and the command layer words it (outcome.error_message)."""

    STATUS = "status"  # look at where the run stands
    STATUS_AND_AGAIN = "status_and_again"  # look, then run the command again if it applies
    READ_AGAIN = "read_again"  # a read that may mix two moments: the same command, run again
    RESUME = "resume"  # once the cause is fixed, `resume` goes on from what was recorded
    # once the cause is fixed, the same `send` again: nothing of its plan was stored
    SEND_AGAIN = "send_again"
    READ_ONLY = "read_only"  # the reading commands still work; the others need it writable
    SEND_FIRST = "send_first"  # no database yet: a send creates it, or --db names another
    LIST_UNKNOWN = "list_unknown"  # the run's report lists its unknown items by id
    # an item left in flight: a reconcile by query settles it first, then a mark by hand
    SETTLE_IN_FLIGHT_FIRST = "settle_in_flight_first"
    LIST_PENDING = "list_pending"  # the run's report lists the items it still has to send
    VERIFY = "verify"  # verify names every row that is not what was recorded
    LIST_RUNS = "list_runs"  # the runs list names the run that was meant
    REPORT = "report"  # the run's report shows how it ended
    REVIEW_THEN_APPROVE = "review_then_approve"  # look at the run again, then approve it
    FIND_RUN_TO_APPROVE = "find_run_to_approve"  # no run has that fingerprint: find the run
    APPROVE_NAMED = "approve_named"  # several runs share the fingerprint: name the run
    CANCEL_INSTEAD = "cancel_instead"  # the run is not awaiting approval: cancel stops it
    # reject without RUN_ID picked a run not awaiting approval; another run awaits it
    REJECT_NAMED = "reject_named"
    FOLLOW_HOLDER = "follow_holder"  # another live process works the run
    # another live process holds the run: a command that does not send runs again after it
    AGAIN_ONCE_HOLDER_STOPS = "again_once_holder_stops"
    FOLLOW_THEN_SEND_AGAIN = "follow_then_send_again"  # a live run holds the file's rows
    RESUME_OR_CANCEL_THEN_SEND_AGAIN = "resume_or_cancel_then_send_again"  # an unfinished one
    # an unfinished one awaiting approval: approve then resume it, or reject it
    APPROVE_OR_REJECT_THEN_SEND_AGAIN = "approve_or_reject_then_send_again"
    CANCEL_THEN_SEND_AGAIN = "cancel_then_send_again"  # an unfinished one being cancelled
    SETTLE_THEN_SEND_AGAIN = "settle_then_send_again"  # a finished run left them unknown
    RESUME_LATER_TO_DRAFT = "resume_later_to_draft"  # drafting stopped, the drafts made kept
    RESUME_TO_APPROVE = "resume_to_approve"  # still drafting: resume drafts, then approve
    RESUME_TO_PREVIEW = "resume_to_preview"  # still drafting: resume drafts, then preview
    EXAMPLE_TZ = "example_tz"  # --tz names no time zone: a send that spells one well
    EXAMPLE_WINDOW = "example_window"  # --window is not a window: a send that spells one well
    CANCEL_AND_SEND_AGAIN = "cancel_and_send_again"  # no drafts to redraft: plan it anew
    RESUME_DRAFTING_FIRST = "resume_drafting_first"  # still drafting: redraft comes after
    CANCEL_AND_COMPOSE_AGAIN = "cancel_and_compose_again"  # approved: redraft would void it
    STATUS_NOT_REDRAFTABLE = "status_not_redraftable"  # past approval: only look at it
    NAME_ROWS = "name_rows"  # no row named: the preview lists the rows' ids
    LIST_ROW_IDS = "list_row_ids"  # ids the run does not have: the preview lists its ids
    REDRAFT_AGAIN = "redraft_again"  # no row got a new draft: once fixed, redraft again
    # Drafting with Claude stopped for every row (compose.ComposeStopped), the drafts kept:
    FIX_KEY_THEN_RESUME = "fix_key_then_resume"  # the API refused the key: fix it, resume
    RESUME_WITH_MODEL = "resume_with_model"  # the API does not know the model: resume with another
    RESUME_DRAFTING = "resume_drafting"  # every batch chunk recorded: resume goes on
    RESUME_ASKS_FIRST = "resume_asks_first"  # a chunk's create in doubt: resume asks, then creates
    RESUME_READS_AGAIN = "resume_reads_again"  # a batch's results broke off: resume reads them
    # Drafting or redrafting cut short, batches a cancel could not reach:
    RESUME_DRAFTS_REST = "resume_drafts_rest"  # drafting interrupted: resume drafts what is left
    RESUME_READS_BATCHES = "resume_reads_batches"  # interrupted, batches left: resume or cancel
    REDRAFT_INSTEAD = "redraft_instead"  # not drafting any more: only redraft changes drafts
    REVIEW_REDRAFTED = "review_redrafted"  # redraft cut short: review it; redraft the rows left
    REDRAFT_NOT_ASKED = "redraft_not_asked"  # redraft cut short, nothing new: the rows left
    CANCEL_AGAIN = "cancel_again"  # batches the API could not be asked about: cancel again


class NotifierError(Exception):
    """A failure with a one-paragraph message naming the thing, the cause and the fix; the
    fix that is a command to run is a NextStep (`then`), worded by the command layer."""

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL
    then: NextStep | None = None
    then_run: str | None = None  # the run `then` concerns, where it names one
    then_items: tuple[str, ...] = ()  # the ids of the run's rows `then` concerns, if any
    # Where `then` concerns several runs: every one, newest first (then_run is the first).
    then_runs: tuple[str, ...] = ()

    def advise(
        self,
        then: NextStep,
        run_id: str | None = None,
        items: Sequence[str] = (),
        *,
        runs: Sequence[str] = (),
    ) -> Self:
        """This failure, with what to do next (about run `run_id`, its rows `items`; or
        about each of `runs`, newest first)."""
        self.then, self.then_items, self.then_runs = then, tuple(items), tuple(runs)
        self.then_run = runs[0] if runs else run_id
        return self


class BadInput(NotifierError):
    """Usage or bad input; nothing was changed."""

    exit_code = ExitCode.BAD_INPUT


class NeedsAttention(NotifierError):
    """Stopped with items needing attention, or paused (a long Retry-After, a full disk)."""

    exit_code = ExitCode.ATTENTION


class Refused(NotifierError):
    """Refused for safety: a live lease, a conflict, a failed integrity check, a lost race."""

    exit_code = ExitCode.REFUSED


class Interrupted(NotifierError):
    """Ctrl-C outside a run's sending loop (while planning, between manual decisions): the
    message says what was already recorded, and what will carry on from there."""

    exit_code = ExitCode.INTERRUPTED
