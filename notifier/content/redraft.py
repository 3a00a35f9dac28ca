"""`notifier redraft [RUN_ID] --item ID…`: new drafts for selected rows of a --compose run
still awaiting approval (docs/guarantees.md, "Drafts").

Nothing of such a run was sent (`awaiting_approval` is reached only from `planned`), so its
intents may still change: the named rows are drafted again, their intents recomputed
exactly as the freeze computes them (intent digest, identity; the idempotency key names
the row's delivery slot, not its content, so it stays, and nothing ever went out under it),
and the run's fingerprint follows. In one transaction, conditional on the run still
awaiting approval with the fingerprint read here: the drafts, the intents, the fingerprint,
and the approval record cleared, with a `redraft` event naming who, which rows and both
fingerprints. An approval binds to the fingerprint and the state version, so the old
fingerprint (and any approval under way) is refused from then on: the run must be reviewed
and approved again.

A row whose new draft fails keeps the draft it had (the others are applied); a row whose
first draft had failed is planned again (`failed` to `pending`) when its new draft works.
Ctrl-C or SIGTERM asks for nothing more but waits for the answers already requested (they
are paid for) and applies them, then exits 130 (143) naming the rows never asked.
The SDK loads only here, when a redraft is asked for."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass

from notifier.config import Config
from notifier.content import compose
from notifier.content.batch_csv import BatchRow
from notifier.content.plan import make_plan, source_identity
from notifier.content.template import from_sources
from notifier.domain.errors import BadInput, ExitCode, Interrupted, NeedsAttention, NextStep
from notifier.domain.intent import content_fingerprint, run_fingerprint
from notifier.domain.records import Run, StoredDraft
from notifier.domain.state_machine import FINISHED_RUN_STATES, RunState
from notifier.engine.run_control import RunControl
from notifier.store import Store


class RedraftUsage(BadInput):
    """Redraft cannot apply to this run or these rows (exit 2): nothing was changed."""


@dataclass(frozen=True)
class Redrafted:
    seq: int
    item_id: str
    draft: compose.Draft
    payload: str
    digest: str
    identity: str | None


@dataclass(frozen=True)
class Result:
    run: Run
    before: str  # the fingerprint the redraft replaced
    redrafted: list[Redrafted]
    kept: list[tuple[str, str]]  # (item id, why its new draft failed): its old one stands


def check_run(run: Run) -> None:
    """Exit 2 unless `run` is a --compose run awaiting approval."""
    rid = run.run_id
    if not run.options.get("compose"):
        if run.state in FINISHED_RUN_STATES:  # nothing left to cancel
            raise RedraftUsage(
                f"run {rid} was not drafted by Claude (no --compose) and is "
                f"{run.state.value}, so it has no drafts to redraft; nothing was changed"
            ).advise(NextStep.STATUS_NOT_REDRAFTABLE, rid)
        raise RedraftUsage(
            f"run {rid} was not drafted by Claude (no --compose), so it has no drafts to redraft; "
            "nothing was changed."
        ).advise(NextStep.CANCEL_AND_SEND_AGAIN, rid)
    if run.state is RunState.AWAITING_APPROVAL:
        return
    if compose.unfrozen(run):
        then = NextStep.RESUME_DRAFTING_FIRST
    elif run.state is RunState.APPROVED:
        then = NextStep.CANCEL_AND_COMPOSE_AGAIN
    else:
        then = NextStep.STATUS_NOT_REDRAFTABLE
    raise RedraftUsage(
        f"run {rid} is {run.state.value}, not awaiting approval, so its rows cannot be "
        "redrafted; nothing was changed"
    ).advise(then, rid)


def pick_rows(
    store: Store,
    run: Run,
    item_ids: Sequence[str],
    drafts: Sequence[StoredDraft] | None = None,
) -> list[tuple[int, BatchRow]]:
    """The rows named by `item_ids` (seq, row as stored before drafting) among `drafts` (the
    run's, read now if None); exit 2 naming any id the run does not have."""
    wanted = list(dict.fromkeys(i.strip() for i in item_ids if i.strip()))
    if not wanted:
        raise RedraftUsage(
            f"redraft of run {run.run_id} names no row; nothing was changed."
        ).advise(NextStep.NAME_ROWS, run.run_id)
    by_id = {}
    for stored in store.drafts.drafts(run.run_id) if drafts is None else drafts:
        row = compose.row_from_source(stored.source)
        by_id[row.item_id] = (stored.seq, row)
    unknown = [i for i in wanted if i not in by_id]
    if unknown:
        raise RedraftUsage(
            f"run {run.run_id} has no row with id {', '.join(map(repr, unknown))}; nothing was "
            "changed."
        ).advise(NextStep.LIST_ROW_IDS, run.run_id)
    return [by_id[i] for i in wanted]


TICK_S = 0.1  # how soon a Ctrl-C is noticed while answers are awaited


@dataclass(frozen=True)
class RedraftAnswers:
    answers: list[tuple[int, BatchRow, compose.Draft | str]]  # a draft, or why it failed
    not_asked: list[str]  # item ids never requested: a Ctrl-C came first


def ask(
    drafter: compose.DraftClient,
    rows: Sequence[tuple[int, BatchRow]],
    concurrency: int,
    interrupted: RunControl | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> RedraftAnswers:
    """A new draft for every row (or the reason it failed), `concurrency` at a time.
    ComposeStopped (exit 3, nothing changed) when drafting must stop for every row. Once
    `interrupted` is set (signals.interrupt_guard), no new request starts, but the requests
    already sent are waited for: their answers are paid for, and kept."""

    def one(row: BatchRow) -> compose.Draft | str:
        try:
            return drafter.draft(row)
        except compose.DraftRejected as exc:
            return str(exc)

    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="redraft") as pool:
        futures = [(seq, row, pool.submit(one, row)) for seq, row in rows]
        waiting = {future for _, _, future in futures}
        noticed = False
        while waiting:
            _, waiting = wait(waiting, timeout=TICK_S, return_when=FIRST_COMPLETED)
            if interrupted is not None and interrupted.signalled and not noticed:
                noticed = True
                drafter.stop()
                for future in waiting:
                    future.cancel()  # not started yet: never asked
                in_flight = sum(1 for f in waiting if not f.cancelled())
                say(
                    f"{interrupted.signal_name} while redrafting: no new request; waiting for the "
                    f"{in_flight} answer(s) already requested, to keep them."
                )
    answers: list[tuple[int, BatchRow, compose.Draft | str]] = []
    not_asked = []
    for seq, row, future in futures:
        try:
            answers.append((seq, row, future.result()))
        except CancelledError:
            not_asked.append(row.item_id)
        except compose.DraftDeferred as exc:
            if exc.why is compose.Deferral.INTERRUPTED:
                not_asked.append(row.item_id)
            else:
                answers.append((seq, row, str(exc)))
    return RedraftAnswers(answers, not_asked)


def intents(
    run: Run, answers: Sequence[tuple[int, BatchRow, compose.Draft | str]], config: Config
) -> tuple[list[Redrafted], list[tuple[str, str]]]:
    """Each new draft as its row's intent, computed by make_plan exactly as the freeze does
    (the run's template, snapshot and key nonce); a draft the template rejects is kept out."""
    template_options = run.options.get("template")
    template = (
        from_sources(template_options["subject"], template_options["body"], "stored template")
        if template_options
        else None
    )
    kept: list[tuple[str, str]] = []
    ready: list[tuple[int, BatchRow, compose.Draft]] = []
    identities: dict[int, str] = {}  # a redrafted row keeps its source row's identity
    for seq, row, answer in answers:
        identities[row.seq] = source_identity(row)
        if isinstance(answer, str):
            kept.append((row.item_id, answer))
            continue
        try:
            final = compose.apply_draft(row, asdict(answer), template)
        except compose.DraftRejected as exc:
            kept.append((row.item_id, str(exc)))
            continue
        ready.append((seq, final, answer))
    if not ready:
        return [], kept
    plan = make_plan(
        [row for _, row, _ in ready],
        config,
        run.run_id,
        snapshot=run.channel_snapshot,
        nonce=run.key_nonce,
        identities=identities,
    )
    try:
        staged = {r[0]: r for r in plan.items.rows()}
    finally:
        plan.close()
    redrafted = []
    for seq, row, answer in ready:
        # The stage's row: store.stage._ITEM_COLUMNS, in that order.
        payload, digest, identity = staged[seq][4], staged[seq][6], staged[seq][8]
        redrafted.append(Redrafted(seq, row.item_id, answer, payload, digest, identity))
    return redrafted, kept


def redraft(
    store: Store,
    run: Run,
    item_ids: Sequence[str],
    key: str,
    config: Config,
    operator: str,
    say: Callable[[str], None],
    interrupted: RunControl | None = None,
) -> Result:
    """Redraft the named rows of `run` (its lease held by the caller) and store the new
    intents and fingerprint, voiding any approval. NeedsAttention (3) when no row got a new
    draft, nothing changed. After a Ctrl-C or SIGTERM (`interrupted`), the drafts answered
    are stored all the same, and RedraftInterrupted names the rows never asked."""
    from notifier.content import claude_messages  # noqa: PLC0415 (the SDK loads only when drafting)

    check_run(run)
    # What the rows are drafted from (the brief, the columns shown to the model, the
    # template, the sources) is what was chained, before any of it reaches the Messages API
    # and its new drafts are chained under the key: the drafts checked are those drafted from.
    drafts = store.drafts.drafts(run.run_id)
    compose.refuse_if_altered(store, run, drafts)
    rows = pick_rows(store, run, item_ids, drafts)
    # Before paying for new drafts; checked again where they are stored (apply_redraft).
    store.drafts.refuse_held_elsewhere(run.run_id, [seq for seq, _ in rows])
    settings = compose.Settings.from_options(run.options)
    drafter = claude_messages.Drafter(settings, key)
    try:
        try:
            asked = ask(drafter, rows, compose.CONCURRENCY, interrupted, say)
        except compose.ComposeStopped as exc:
            # Not the stop's own next step: that one goes on drafting a run, not redrafting.
            raise NeedsAttention(f"run {run.run_id}: {exc}. Nothing was redrafted.").advise(
                NextStep.REDRAFT_AGAIN, run.run_id
            ) from exc
    finally:
        drafter.close()
    redrafted, kept = intents(run, asked.answers, config)
    for item_id, why in kept:
        say(f"row {item_id}: the new draft failed ({why}); it keeps the draft it had")
    if redrafted:
        changed = {r.seq: r.digest for r in redrafted}
        digests = [
            changed.get(item.seq, item.intent_digest) for item in store.queries.items(run.run_id)
        ]
        store.drafts.apply_redraft(
            run.run_id,
            run.fingerprint,
            run_fingerprint(digests, run.channel_snapshot),
            content_fingerprint(digests, list(run.channel_snapshot)),
            [(r.seq, asdict(r.draft), r.payload, r.digest, r.identity) for r in redrafted],
            operator,
        )
    result = Result(store.core.get_run(run.run_id), run.fingerprint, redrafted, kept)
    if interrupted is not None and interrupted.signalled:
        raise _interruption(result, asked.not_asked, interrupted)
    if not redrafted:
        raise NeedsAttention(
            f"run {run.run_id}: no row got a new draft, so nothing was changed and its "
            "fingerprint stands."
        ).advise(NextStep.REDRAFT_AGAIN, run.run_id)
    return result


class RedraftInterrupted(Interrupted):
    """Ctrl-C while redrafting (130): the drafts answered are kept; the rows never asked
    are the ids its next step concerns (`then_items`)."""


class RedraftTerminated(RedraftInterrupted):
    """SIGTERM while redrafting (143), kept alike."""

    exit_code = ExitCode.TERMINATED


def _interruption(
    result: Result, not_asked: Sequence[str], interrupted: RunControl
) -> RedraftInterrupted:
    """What a redraft cut short kept (the answers already paid for, stored as one redraft);
    its next step names the rows never asked (`then_items`), and only those."""
    rid = result.run.run_id
    if result.redrafted:
        done = (
            f"{len(result.redrafted)} row(s) redrafted and stored ("
            + ", ".join(r.item_id for r in result.redrafted)
            + f"), {len(result.kept)} kept their draft after a failed answer; the run's "
            "fingerprint changed, so any approval of the old one is void"
        )
    else:
        done = "No new draft was received: nothing was changed and the fingerprint stands."
    kind = RedraftTerminated if interrupted.first_signal == signal.SIGTERM else RedraftInterrupted
    stopped = kind(
        f"run {rid}: redraft interrupted ({interrupted.signal_name}): no new request was made "
        f"after it, and the answers already requested were waited for. {done}"
    )
    if result.redrafted:
        return stopped.advise(NextStep.REVIEW_REDRAFTED, rid, not_asked)
    return stopped.advise(NextStep.REDRAFT_NOT_ASKED, rid, not_asked) if not_asked else stopped
