"""Drafting a --compose run, as the commands see it: the settings a send starts with, the
model checked before anything is stored, what `resume --model` / `--recreate` change, and
which path drafts (one request per row, or Message Batches: claude_batches.py).

Kept out of the command line and the API and out of compose.py (which knows
nothing of the SDK): the SDK loads only in the functions that talk to the API."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from notifier.content import compose
from notifier.content.batch_csv import BatchRow
from notifier.domain.errors import BadInput, ExitCode, Interrupted, NextStep
from notifier.engine.run_control import RunControl
from notifier.engine.signals import interrupt_guard
from notifier.observe.progress import progress_bar

if TYPE_CHECKING:
    from notifier.content.claude_batch_api import ChunkLeftOpen
    from notifier.domain.records import Run
    from notifier.engine.membership import Lease
    from notifier.store import Store

# Above this many rows a --compose send drafts through Message Batches even without
# --batch-api (README, "Content"): half the price, and no request per row held open.
BATCH_API_ABOVE_ROWS = 1000
CHUNK_ENV = "NOTIFIER_BATCH_CHUNK_ROWS"  # rehearsals: smaller chunks than the default


def settle_settings(
    settings: compose.Settings,
    rows: list[BatchRow],
    batch: Path,
    columns: str | None,
    *,
    dry_run: bool,
) -> compose.Settings:
    """The settings a send drafts with: the columns checked against the file (exit 2), and
    the batch path chosen (never for a dry run, whose three drafts are asked for at once)."""
    try:
        chosen = compose.parse_columns(columns, rows, batch)
    except compose.ComposeUsage as exc:
        raise BadInput(str(exc)) from exc
    batch_api = not dry_run and (settings.batch_api or len(rows) > BATCH_API_ABOVE_ROWS)
    return replace(settings, columns=chosen, batch_api=batch_api)


def compose_key() -> str:
    """The Anthropic API key a --compose run drafts with; exit 2 when there is none."""
    try:
        return compose.api_key()
    except compose.ComposeUsage as exc:
        raise BadInput(str(exc)) from exc


def check_model(settings: compose.Settings, key: str) -> None:
    """Exit 2, before anything is stored, when the Models API does not know the model."""
    from notifier.content import claude_messages  # noqa: PLC0415 (the SDK loads only when drafting)

    drafter = claude_messages.Drafter(settings, key)
    try:
        drafter.check_model()
    except claude_messages.UnknownModel as exc:
        raise BadInput(str(exc)) from exc
    finally:
        drafter.close()


def resume_overrides(
    store: Store, run: Run, model: str | None, recreate: bool, say: Callable[[str], None]
) -> Run:
    """`resume --model NAME` (rows not drafted yet) and `--recreate` (chunks in doubt), both
    recorded with the run before drafting resumes; refused (exit 2) for a run not drafting."""
    if not compose.unfrozen(run):
        given = "--model" if model is not None else "--recreate"
        raise BadInput(
            f"run {run.run_id} is not drafting (its drafts are frozen into intents), so "
            f"{given} changes nothing; nothing was changed."
        ).advise(NextStep.REDRAFT_INSTEAD, run.run_id)
    if model is not None:
        settings = compose.Settings.from_options(run.options)
        drafting_with = replace(settings, model=model)
        check_model(drafting_with, compose_key())
        before, pending = store.drafts.set_compose_model(run.run_id, model)
        say(
            f"run {run.run_id}: the {pending} row(s) not drafted yet will be drafted with "
            f"{model} (was {before}); the drafts already made keep their model."
        )
    if recreate:
        chosen = store.chunks.choose_recreate(run.run_id)
        say(
            f"run {run.run_id}: --recreate: {chosen} batch chunk(s) whose creation is in doubt "
            "will be created again without looking for them (a chunk created before is paid "
            "twice)."
        )
    return store.core.get_run(run.run_id)


def chunk_rows() -> int:
    """Rows per batch chunk: far below the API's 100,000 requests and 256 MB per batch, so
    a chunk in doubt costs little."""
    from notifier.content.claude_batches import CHUNK_ROWS  # noqa: PLC0415

    value = os.environ.get(CHUNK_ENV, "").strip()
    if value.isascii() and value.isdigit() and int(value) > 0:
        return int(value)
    return CHUNK_ROWS


def draft(
    store: Store, run: Run, key: str, say: Callable[[str], None], lease: Lease
) -> compose.DraftProgress:
    """Draft the rows of `run` without a draft (its `lease` held): through Message Batches
    when the run chose them, else one request per row. Ctrl-C or SIGTERM (the first) stops
    asking for more but keeps what was asked for: the synchronous path waits for the answers
    in flight and stores them; the batch path leaves its submitted batches for `resume`.
    Either way DraftingInterrupted (130, 143 for SIGTERM) says what was kept; a second
    signal leaves at once (signals.interrupt_guard)."""
    from notifier.content import claude_messages  # noqa: PLC0415 (the SDK loads only when drafting)

    settings = compose.Settings.from_options(run.options)
    interrupted = RunControl()
    total = store.drafts.draft_summary(run.run_id)
    with interrupt_guard(interrupted, say), progress_bar(total["total"], "drafting") as advance:
        advance(total["total"] - total["pending"])
        if settings.batch_api:
            from notifier.content.claude_batches import BatchDrafting  # noqa: PLC0415

            by_batches = BatchDrafting(store, run, settings, key, say, lease, interrupted, advance)
            try:
                progress = by_batches.draft(chunk_rows())
            finally:
                by_batches.close()
        else:
            drafter = claude_messages.Drafter(settings, key)
            try:
                progress = compose.draft_pending(
                    store, run.run_id, drafter, say, interrupted=interrupted, advance=advance
                )
            finally:
                drafter.close()
    if progress.cancelled:
        from notifier.content.claude_batches import DraftingCancelled  # noqa: PLC0415

        raise DraftingCancelled(
            f"run {run.run_id}: cancel requested while drafting: no new draft was requested "
            f"after it, and the {progress.kept} answer(s) already requested were waited for "
            f"and stored ({progress.drafted} row(s) drafted, {progress.pending} never "
            "drafted; nothing was sent)."
        )
    if progress.interrupted is not None:
        raise interruption(store, run, progress, batches=settings.batch_api)
    return progress


class DraftingInterrupted(Interrupted):
    """Ctrl-C while drafting (130): what was asked for is kept, `resume` goes on."""


class DraftingTerminated(DraftingInterrupted):
    """SIGTERM while drafting (143), kept alike."""

    exit_code = ExitCode.TERMINATED


def interruption(
    store: Store, run: Run, progress: compose.DraftProgress, *, batches: bool
) -> DraftingInterrupted:
    """The error a drafting interrupted by `progress.interrupted` leaves with: how many
    drafts were kept, what was left with the API, and (its NextStep) what goes on."""
    signal_seen = progress.interrupted
    assert signal_seen is not None
    name, run_id = signal_seen.signal_name, run.run_id
    done = (
        f"{progress.drafted} row(s) drafted, {progress.failed} failed, {progress.pending} "
        "still to draft"
    )
    if batches:
        open_chunks = store.chunks.chunks(run_id, ["creating", "submitted"])
        batch_ids = [c.batch_id for c in open_chunks if c.batch_id]
        text = (
            f"run {run_id}: interrupted while drafting ({name}): polling stopped; the "
            f"{len(batch_ids)} batch(es) already submitted ({', '.join(batch_ids) or 'none'}) "
            "are recorded and left with the API, which keeps their results for 29 days, so "
            f"nothing paid for is lost ({done}; nothing was sent)."
        )
        then = NextStep.RESUME_READS_BATCHES
    else:
        text = (
            f"run {run_id}: interrupted while drafting ({name}): no new request was made, and "
            f"the {progress.kept} draft(s) answered after the interruption were waited for "
            f"and kept ({done}; nothing was sent)."
        )
        then = NextStep.RESUME_DRAFTS_REST
    kind = DraftingTerminated if signal_seen.first_signal == signal.SIGTERM else DraftingInterrupted
    return kind(text).advise(then, run_id)


@dataclass(frozen=True)
class BatchesLeftOpen:
    """The batch chunks of a cancelled run still open after `cancel_batches`: those the API
    could not be asked about (`unasked`), and how many could not even be looked up, the key
    not being set (`not_looked_up`). Each may still run; a later `cancel` finishes it."""

    unasked: tuple[ChunkLeftOpen, ...] = ()
    not_looked_up: int = 0

    @property
    def count(self) -> int:
        return len(self.unasked) + self.not_looked_up


def cancel_batches(store: Store, run_id: str, say: Callable[[str], None]) -> BatchesLeftOpen:
    """After `notifier cancel` of a run that drafted through batches: cancel (and record)
    any batch still open, e.g. one left by a drafting process that was interrupted or
    killed. Returns the chunks that stay open (the API could not be asked about them)."""
    open_chunks = store.chunks.chunks(run_id, ["creating", "submitted"])
    if not open_chunks:
        return BatchesLeftOpen()
    try:
        key = compose.api_key()
    except compose.ComposeUsage:
        return BatchesLeftOpen(not_looked_up=len(open_chunks))
    # The SDK loads only when drafting.
    from notifier.content.claude_batch_api import cancel_batches as cancel  # noqa: PLC0415
    from notifier.content.claude_client import claude_client  # noqa: PLC0415

    client = claude_client(key, max_retries=2)
    try:
        return BatchesLeftOpen(tuple(cancel(store, run_id, client, say)))
    finally:
        client.close()
