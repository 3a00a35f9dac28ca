"""What `send` and `resume` (and `worker`) share once a run is stored: drafting it on
screen, the progress bar, the closing line with its exit code, the wait for approval."""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from notifier.cli import outcome
from notifier.cli.group import echo, suggesting
from notifier.domain import clock
from notifier.domain.errors import BadInput, ExitCode, Interrupted, Refused
from notifier.observe.progress import progress_bar
from notifier.ops import approval

if TYPE_CHECKING:
    from datetime import datetime

    from notifier.api import Drafted, Notifier
    from notifier.domain.records import Run
    from notifier.engine.runner import RunResult


def progress(total: int, *, quiet: bool = False) -> AbstractContextManager[Callable[[int], None]]:
    """The sending progress bar (notifier/observe/progress.py); none when `quiet` (stderr carries
    JSON logs, where a bar's redraws would break the lines)."""
    if quiet:
        return nullcontext(lambda n: None)
    return progress_bar(total, "sending")


def finish(
    ctx: click.Context,
    run_id: str,
    result: RunResult,
    draft_failures: int = 0,
    *,
    again: str,
) -> None:
    """Say how the run ended and what to do next (`again`: outcome.send_again), and exit
    with the contract's code."""
    from notifier.cli.outcome import run_advice, run_exit  # noqa: PLC0415 (start-up time)

    advice = run_advice(result, run_id, again)
    echo(f"run {run_id}: {result.reason}." + (f" {advice}" if advice else ""))
    code = run_exit(result)
    if draft_failures and code is ExitCode.DONE:
        code = ExitCode.ATTENTION  # the rows whose draft failed were never planned
    ctx.exit(code)


def draft(ctx: click.Context, notifier: Notifier, run_id: str) -> Drafted:
    """Draft what a --compose run lacks; Ctrl-C leaves with 130, the drafts made stored."""
    try:
        return notifier.draft(run_id)
    except KeyboardInterrupt:
        echo(
            f"interrupted while drafting: the drafts already made are stored and nothing was "
            f"sent. `notifier resume {run_id}` drafts the rest.",
            err=True,
        )
        ctx.exit(ExitCode.INTERRUPTED)
        raise  # unreachable: ctx.exit raises


def report_draft_failures(drafted: Drafted) -> int:
    for failure in drafted.failures:
        echo(
            f"row {failure.seq} (line {failure.line}) was not drafted and will not be sent: "
            f"{failure.error}"
        )
    return len(drafted.failures)


def await_approval(notifier: Notifier, run: Run) -> None:
    for line in glimpse_lines(run.run_id, notifier.approval_preview(run)):
        click.echo(line)  # notifications as stored; its advice line completed
    echo(
        f"run {run.run_id} is awaiting approval; nothing was sent. "
        f"{review_advice(run.run_id)} Then `notifier resume {run.run_id}` sends it."
    )


def glimpse_lines(run_id: str, glimpse: approval.Glimpse) -> list[str]:
    """The start of a run's review, and where to read every notification it leaves out."""
    if not glimpse.unshown:
        return glimpse.lines
    return [
        *glimpse.lines,
        suggesting(
            f"  … and {glimpse.unshown} more: `notifier preview {run_id} --format csv "
            "--output FILE` writes every one."
        ),
    ]


def review_advice(run_id: str) -> str:
    """How to review a run before approving it (what every refusal points to)."""
    return (
        f"Review every notification with `notifier preview {run_id}` (its last line is the "
        f"fingerprint of what it showed), then approve that with `notifier approve {run_id} "
        "--fingerprint sha256:…`."
    )


def _plan_again(refusal: approval.NotApproved) -> str:
    """How to send a run's file as it was meant once its stored notifications changed: the
    run cancelled, and the file planned again with the run's own options for a review. Never
    --new-run: the rows the run delivered are left out of the new plan, not sent twice."""
    run = refusal.run
    batch = run.batch_path if run is not None else "BATCH.csv"
    options = dict(run.options) if run is not None else {}
    options["require_approval"] = True
    return (
        f"Cancel it (`notifier cancel {refusal.run_id}`), then plan its file again for a "
        f"review (`{outcome.send_again(batch, options)}`): the rows it delivered are left "
        "out, not sent again."
    )


def not_approved(refusal: approval.NotApproved) -> Refused:
    """The refusal (exit 4) of a send or an approval the run's approval does not allow:
    why, and the command that works. A whole fingerprint is never printed to be pasted."""
    run_id, record = refusal.run_id, refusal.approval
    review = review_advice(run_id)
    then = f"Then `notifier resume {run_id}` sends it."
    approver = record.operator if record is not None else "its approver"
    match refusal.why:
        case approval.Unapproved.AWAITING:
            return Refused(
                f"run {run_id} is awaiting approval; nothing was sent. {review} Then "
                f"`notifier resume {run_id}` sends it; `notifier reject {run_id} --reason …` "
                "closes it instead."
            )
        case approval.Unapproved.NO_RECORD:
            return Refused(
                f"run {run_id} requires an approval but has no valid approval record; nothing "
                f"was sent. {review} {then}"
            )
        case approval.Unapproved.EXPIRED:
            at = f" at {clock.local(record.expires_at)}" if record is not None else ""
            return Refused(
                f"run {run_id}: the approval by {approver} expired{at}; nothing was sent and "
                f"the run was left as it was. {review} {then}"
            )
        case approval.Unapproved.CHANGED:
            return Refused(
                f"run {run_id}: its stored notifications no longer hash to the fingerprint "
                f"{approver} approved: they were changed after approval, so they are not what "
                f"was reviewed. Nothing was sent. {_plan_again(refusal)}"
            )
        case approval.Unapproved.CHANGED_SINCE_PLANNED:
            return Refused(
                f"run {run_id}: its stored notifications no longer hash to the fingerprint "
                "computed when it was planned: they were changed after planning, so no preview "
                f"shows what would be sent. Nothing was approved or sent. {_plan_again(refusal)}"
            )
        case approval.Unapproved.NOT_ITS_FINGERPRINT:
            return Refused(
                f"run {run_id}: fingerprint {approval.abridged(refusal.given)!r} is not the "
                "fingerprint of its notifications as they are stored now: it was copied from "
                "another run's preview, mistyped, or the notifications changed since that "
                f"preview. Nothing was approved. {review}"
            )


class Rate(click.ParamType[float]):
    """--rate: sends per second, finite and at least one a day (channels/options.MIN_RATE):
    a slower one is a wait of millennia between two sends, past any date a pause can name."""

    name = "float"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        from notifier.channels.options import rate_problem  # noqa: PLC0415 (start-up time)

        rate = click.FLOAT.convert(value, param, ctx)
        problem = rate_problem(rate)
        if problem is not None:
            self.fail(f"{value!r} {problem}.", param, ctx)
        return rate


RATE = Rate()


class Wait(click.FloatRange):
    """--max-wait: seconds, 0 or more. NaN is no number of seconds: it compares false with
    every wait, so a run given it would never pause, however long it waits."""

    def __init__(self) -> None:
        super().__init__(min=0)

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds.", param, ctx)
        return seconds


WAIT = Wait()


def deadline_option(text: str | None, allow_expired: bool) -> datetime | None:
    """--not-after as a time; one already past is a usage error unless --allow-expired:
    every item would expire unsent, which is rarely what the operator meant."""
    if text is None:
        return None
    from notifier.content.batch_csv import parse_deadline  # noqa: PLC0415 (start-up time)

    try:
        deadline = parse_deadline(text)
    except ValueError as exc:
        raise BadInput(
            f"--not-after: {exc}. Use ISO 8601 with a zone, e.g. 2026-12-01T09:00:00+01:00."
        ) from exc
    now = clock.now()
    if deadline <= now and not allow_expired:
        raise BadInput(
            f"--not-after {text} is already past (it is {clock.iso(now)}): every item would "
            "expire unsent. Give a later time, or pass --allow-expired to plan the batch "
            "anyway; nothing was stored."
        )
    return deadline


STDIN = "-"


def batch_file(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """BATCH, a file to read. `-` (standard input) is spooled whole to a private temporary
    file first, since the whole file is validated before anything is stored and read again
    to plan it; the run records its source as `-`, and every command the tool suggests
    pipes the rows in again (`… | notifier send - …`). The spool is removed when the
    command ends, and at once if reading the rows is cut short: it holds recipients."""
    if str(value) != STDIN:
        return value
    try:
        spool_dir = Path(tempfile.mkdtemp(prefix="notifier-stdin-"))
    except OSError as exc:
        raise _unspooled(Path(tempfile.gettempdir()), exc) from exc
    spool = spool_dir / "stdin.csv"
    piped = sys.stdin.buffer
    try:
        with spool.open("wb") as sink:
            while chunk := piped.read(1 << 16):
                sink.write(chunk)
    except BaseException as exc:
        # The context is not closed when its arguments fail: nothing else removes it.
        shutil.rmtree(spool_dir, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted(
                "interrupted (Ctrl-C) while reading the rows piped in on standard input: "
                "nothing was stored and nothing was sent. Pipe them in again "
                "(`… | notifier send - …`) to plan and send them."
            ) from None
        if isinstance(exc, OSError):
            raise _unspooled(spool_dir.parent, exc) from exc
        raise
    ctx.call_on_close(lambda: shutil.rmtree(spool_dir, ignore_errors=True))
    ctx.meta[STDIN] = spool
    return spool


def _unspooled(where: Path, exc: OSError) -> BadInput:
    return BadInput(
        f"standard input: the rows piped in could not be kept in {where} to be read whole "
        f"({exc.strerror or exc}); nothing was stored and nothing was sent. Free space there "
        "or point TMPDIR at a directory with room, or give the file's path instead of `-`."
    )


def batch_name(ctx: click.Context, batch: Path) -> Path:
    """What the run and the advice call BATCH: `-` for rows piped in, else the file."""
    return Path(STDIN) if ctx.meta.get(STDIN) == batch else batch


@contextmanager
def naming_stdin(source: Path, batch: Path) -> Iterator[None]:
    """Rows piped in are named as standard input in what a refusal to read them says, not
    as the spool they were read from (a temporary file, gone once the command ends)."""
    try:
        yield
    except BadInput as exc:
        if source != batch and str(source) in str(exc):
            exc.args = (str(exc).replace(str(source), "standard input (`-`)"),)
        raise
