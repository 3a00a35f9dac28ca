"""`send --compose BRIEF`: Claude drafts each row's subject and body (docs/design.md section 10).

Drafting happens while planning. Every draft is stored with its row (with the model and the
token usage) as soon as it arrives; only when no row is left to draft are the intents, their
digests and the run's fingerprint computed from the stored drafts ("frozen"). A draft has no
side effect, so a crash before one is stored just asks again; a stored draft is never asked
for again, so `resume` never changes a digest.

The requests themselves are claude_messages.py's (imported only when drafting: the SDK is heavy to
load and every other command starts without it).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from notifier.config import Config
from notifier.content import schedule
from notifier.content.batch_csv import BatchRow
from notifier.content.plan import Plan, make_plan, source_identity
from notifier.content.template import Template, from_sources, render_row, render_rows
from notifier.content.text_rules import LINE_BREAKS, text_problems
from notifier.domain import clock
from notifier.domain.chain import UNKEYED, ChainKind
from notifier.domain.errors import BadInput, NeedsAttention, NextStep, NotifierError, Refused
from notifier.domain.intent import DraftingInputs, canonical_json
from notifier.domain.records import Run, StoredDraft
from notifier.domain.replay import (
    Change,
    Difference,
    DraftRecord,
    Rebuilt,
    Table,
    compare_drafts,
    replay,
)
from notifier.domain.state_machine import RunTrigger
from notifier.domain.verify import verify_run
from notifier.engine.run_control import RunControl
from notifier.store import Store

KEY_ENV = "ANTHROPIC_API_KEY"
CONCURRENCY = 4  # requests in flight at once while drafting
DRY_RUN_ROWS = 3
# The row's fields besides its data columns, as the model may see them (`to` only if named).
ROW_FIELDS = ("id", "to", "subject", "body", "not_after")


class ComposeUsage(BadInput):
    """Cannot start drafting (no key, empty brief): exit 2, nothing stored."""


class ComposeStopped(NeedsAttention):
    """Drafting stopped for every row (401/403, unknown model): exit 3; drafts already
    stored are kept and `resume` continues once the cause is fixed. Its text is the fact
    (which a run's message embeds), its `then` what the operator can do about it."""


class DraftRejected(NotifierError):
    """This row's answer was unusable: the row fails, the others go on. The usage of an
    answer that was paid for is kept with the failure (`usage`: model, tokens in, out)."""

    def __init__(self, message: str, usage: tuple[str, int, int] | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class Deferral(StrEnum):
    """Why the API gave no draft through every retry, as an operator is told it."""

    UNREACHABLE = "could not be reached (DNS, connection refused or reset, timeout)"
    RATE_LIMITED = "kept answering 429 (rate-limited) or 529 (overloaded)"
    SERVER_ERROR = "kept failing with a server error (5xx)"
    INTERRUPTED = "was not asked: drafting was interrupted"


class DraftDeferred(NotifierError):
    """The API gave no draft through every retry (`why`): the row stays undrafted, and a
    later `resume` asks again."""

    def __init__(self, message: str, why: Deferral) -> None:
        super().__init__(message)
        self.why = why


class DraftClient(Protocol):
    """What drafting needs from the client (claude.Drafter): one draft per row."""

    def draft(self, row: BatchRow) -> Draft: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Draft:
    subject: str
    body: str
    model: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Settings:
    """What a resume needs to draft the rest exactly as the send began (stored in options)."""

    brief: str
    model: str
    columns: tuple[str, ...] | None = None  # None: every column but `to`
    batch_api: bool = False

    def as_options(self) -> dict[str, Any]:
        return {
            "brief": self.brief,
            "model": self.model,
            "columns": list(self.columns) if self.columns is not None else None,
            "batch_api": self.batch_api,
        }

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Settings:
        compose = options["compose"]
        columns = compose.get("columns")
        return cls(
            brief=str(compose["brief"]),
            model=str(compose["model"]),
            columns=tuple(columns) if columns is not None else None,
            batch_api=bool(compose.get("batch_api", False)),
        )


def unfrozen(run: Run) -> bool:
    """A --compose run whose intents are not computed yet (its fingerprint is empty)."""
    return bool(run.options.get("compose")) and run.fingerprint == ""


def api_key() -> str:
    """The key, only ever from the environment (never stored, never printed)."""
    key = os.environ.get(KEY_ENV, "").strip()
    if not key:
        raise ComposeUsage(
            f"--compose needs a Claude API key in the environment variable {KEY_ENV}, which "
            "is not set; nothing was stored. Export it and run the command again."
        )
    return key


def row_to_source(row: BatchRow) -> str:
    return json.dumps(row._asdict(), sort_keys=True, ensure_ascii=False)


def row_from_source(source: str) -> BatchRow:
    return BatchRow(**json.loads(source))


def row_values(row: BatchRow) -> dict[str, Any]:
    values: dict[str, Any] = dict(row.data)
    values.update(id=row.item_id, to=row.to, subject=row.subject, body=row.body)
    if row.not_after:
        values["not_after"] = row.not_after
    return values


def prompt_row(row: BatchRow, columns: Sequence[str] | None = None) -> str:
    """The row as the model sees it, as canonical JSON: the `columns` named, else every
    column but `to` (a recipient's address goes to the API only when asked for)."""
    values = row_values(row)
    if columns is None:
        values.pop("to", None)
    else:
        values = {name: values[name] for name in columns if name in values}
    return canonical_json(values)


def parse_columns(
    text: str | None, rows: Sequence[BatchRow], batch: Path
) -> tuple[str, ...] | None:
    """--compose-columns a,b,c: names that exist in the file (exit 2 otherwise)."""
    if text is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    known = set(ROW_FIELDS) | (set(rows[0].data) if rows else set())
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ComposeUsage(
            f"--compose-columns {text!r}: {', '.join(map(repr, unknown)) or 'no column'} is "
            f"not a column of {batch} (it has: {', '.join(sorted(known))}); nothing was "
            "stored. Name the columns the model should see, e.g. --compose-columns id,name."
        )
    return names


def check_draft_text(subject: str, body: str) -> tuple[str, str]:
    """Drafted text under the rules every notification's text is held to (text_rules;
    DraftRejected saying which broke), a subject's line breaks folded first, and neither
    empty."""
    subject = " ".join(LINE_BREAKS.split(subject)).strip()
    body = body.replace("\r\n", "\n")
    if not subject or not body.strip():
        raise DraftRejected("malformed answer: the subject or the body is empty")
    problems = text_problems(subject, body)
    if problems:
        raise DraftRejected("; ".join(f"drafted: {p}" for p in problems))
    return subject, body


# ---------------------------------------------------------------------- drafting a run


@dataclass(frozen=True)
class DraftProgress:
    drafted: int
    failed: int
    pending: int
    stopped: ComposeStopped | None = None  # why drafting stopped for every row, and then what
    interrupted: RunControl | None = None  # set: Ctrl-C or SIGTERM stopped drafting
    kept: int = 0  # answers that arrived after the interruption, stored all the same
    deferred: Deferral | None = None  # why the last row left undrafted got no draft
    cancelled: bool = False  # `notifier cancel` stopped drafting: nothing more was asked


def draft_pending(
    store: Store,
    run_id: str,
    drafter: DraftClient,
    say: Callable[[str], None],
    concurrency: int = CONCURRENCY,
    *,
    interrupted: RunControl | None = None,
    advance: Callable[[int], None] = lambda n: None,
) -> DraftProgress:
    """Draft every row of the run that has no draft yet, `concurrency` at a time, storing
    each result as it arrives (this thread writes; the pool only talks to the API).

    Once `interrupted` is set (Ctrl-C, SIGTERM: signals.interrupt_guard), no new request and
    no retry starts, but the requests already sent are waited for and their answers stored:
    they are paid for. A `notifier cancel` of the run is read every CANCEL_LOOK_S and
    stops drafting alike (no new request; the answers in flight stored). `advance(n)`
    counts rows settled (a progress bar)."""
    if store.core.get_run(run_id).cancel_requested_at:
        return _progress(store, run_id, cancelled=True)
    pending = store.drafts.pending_drafts(run_id)
    rows = [(seq, row_from_source(source)) for seq, source in pending]
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="draft") as pool:
        futures: dict[Future[Draft], tuple[int, BatchRow]] = {
            pool.submit(drafter.draft, row): (seq, row) for seq, row in rows
        }
        storing = _Storing(store, run_id, drafter, futures, say, advance)
        try:
            storing.run(interrupted)
        except KeyboardInterrupt:
            # Without a guard (not the main thread): no new request, no retry; what is in
            # flight ends without being stored (a draft has no side effect: resume asks).
            storing.stop_new()
            raise
    return _progress(
        store,
        run_id,
        stopped=storing.stopped,
        interrupted=interrupted if storing.noticed else None,
        kept=storing.kept,
        deferred=storing.deferred,
        cancelled=storing.cancelled,
    )


def _progress(store: Store, run_id: str, **outcome: Any) -> DraftProgress:
    summary = store.drafts.draft_summary(run_id)
    return DraftProgress(summary["drafted"], summary["failed"], summary["pending"], **outcome)


class _Storing:
    """The results of one drafting pass, stored as they arrive."""

    TICK_S = 0.1  # how soon an interruption is noticed while answers are awaited
    CANCEL_LOOK_S = 0.5  # how often the run is read for a `notifier cancel`

    def __init__(
        self,
        store: Store,
        run_id: str,
        drafter: DraftClient,
        futures: Mapping[Future[Draft], tuple[int, BatchRow]],
        say: Callable[[str], None],
        advance: Callable[[int], None],
    ) -> None:
        self.store, self.run_id, self.drafter = store, run_id, drafter
        self.futures, self.say, self.advance = futures, say, advance
        self.stopped: ComposeStopped | None = None
        self.noticed = False  # the interruption was seen: nothing new was asked after it
        self.kept = 0
        self.deferred: Deferral | None = None
        self.cancelled = False  # a `notifier cancel` was seen: nothing new was asked after it
        self._next_look = 0.0

    def stop_new(self) -> None:
        """No new request and no retry; requests already sent go on to their answer."""
        self.drafter.stop()
        for other in self.futures:
            other.cancel()  # not started yet: they stay undrafted

    def run(self, interrupted: RunControl | None) -> None:
        waiting = set(self.futures)
        while waiting:
            done, waiting = wait(waiting, timeout=self.TICK_S, return_when=FIRST_COMPLETED)
            if interrupted is not None and interrupted.signalled and not self.noticed:
                self.noticed = True
                self.stop_new()
                in_flight = sum(1 for f in waiting if not f.cancelled())
                self.store.drafts.note_drafting(
                    self.run_id, "drafting_interrupted", {"signal": interrupted.signal_name,
                                                          "in_flight": in_flight},
                )  # fmt: skip
                self.say(
                    f"{interrupted.signal_name} while drafting: waiting for the {in_flight} "
                    "answer(s) already requested, to store them."
                )
            for future in done:
                self._settle(future)
            if self.stopped is None and not self.noticed:
                self._look_for_cancel(waiting)

    def _look_for_cancel(self, waiting: set[Future[Draft]]) -> None:
        """A `notifier cancel` of the run, read every CANCEL_LOOK_S: no new request and no
        retry from then on (each is paid for); the answers in flight are stored."""
        now = time.monotonic()
        if self.cancelled or now < self._next_look:
            return
        self._next_look = now + self.CANCEL_LOOK_S
        if not self.store.core.get_run(self.run_id).cancel_requested_at:
            return
        self.cancelled = True
        self.stop_new()
        in_flight = sum(1 for f in waiting if not f.cancelled())
        self.store.drafts.note_drafting(self.run_id, "drafting_cancelled", {"in_flight": in_flight})
        self.say(
            f"cancel requested while drafting: waiting for the {in_flight} answer(s) already "
            "requested, to store them."
        )

    def _settle(self, future: Future[Draft]) -> None:
        if future.cancelled():
            return  # cancelled by a stop before a thread took it: stays undrafted
        seq, row = self.futures[future]
        try:
            draft = future.result()
        except ComposeStopped as exc:
            if self.stopped is None:
                self.stopped = exc
                self.stop_new()
            return
        except DraftRejected as exc:
            self.store.drafts.fail_draft(self.run_id, seq, str(exc), usage=exc.usage)
            self.say(f"draft for item {row.item_id} (line {row.line}) failed: {exc}")
            self.advance(1)
            return
        except DraftDeferred as exc:
            self.deferred = exc.why
            if not (self.noticed or self.cancelled):
                self.say(f"draft for item {row.item_id} not made yet: {exc}")
            return
        self.store.drafts.save_draft(self.run_id, seq, asdict(draft))
        self.advance(1)
        if self.noticed or self.cancelled:
            self.kept += 1


def first_drafts(
    drafter: DraftClient, rows: Sequence[BatchRow]
) -> list[tuple[BatchRow, Draft | str]]:
    """--dry-run: drafts for the first rows, stored nowhere (a failure shows as its text)."""
    shown: list[tuple[BatchRow, Draft | str]] = []
    for row in rows:
        try:
            shown.append((row, drafter.draft(row)))
        except DraftRejected as exc:
            shown.append((row, f"draft failed: {exc}"))
        except DraftDeferred as exc:  # the API gave none through every retry
            shown.append((row, f"no draft: the Messages API {exc.why.value} ({exc})"))
    return shown


def check_template(template: Template, rows: Sequence[BatchRow], path: Path) -> None:
    """Before any token is spent: every row renders with a stand-in draft, so a missing
    column is a problem of its line now (exit 2, nothing stored), not after drafting."""
    stand_in = {"subject": "", "body": ""}
    render_rows(template, list(rows), path, {row.seq: stand_in for row in rows})


def apply_draft(row: BatchRow, draft: Mapping[str, str], template: Template | None) -> BatchRow:
    """The row as it will be sent: the draft, or the template rendered with `draft`."""
    if template is None:
        return row._replace(subject=draft["subject"], body=draft["body"])
    result = render_row(template, row, draft)
    if isinstance(result, BatchRow):
        return result
    raise DraftRejected(result.message)


def refuse_if_altered(store: Store, run: Run, drafts: Sequence[StoredDraft]) -> None:
    """Refused (exit 4, nothing drafted or frozen) unless the run's chain holds, under its
    key, and `run` and `drafts`, as the caller read them to draft or freeze from, are what
    was chained: what is drafted from, and frozen, is what was checked."""
    chained = chained_drafting(store, run.run_id)
    if chained is not None:
        _refuse_if_changed(chained, run, drafts)


def chained_drafting(store: Store, run_id: str) -> Rebuilt | None:
    """What the run's events chained of its drafting (the digest of its inputs, each
    draft's), once the run is verified under its chain's key: Refused (nothing frozen) when
    anything of it is not what was chained. The freeze makes intents of the drafts, sources,
    options and channel snapshot as stored, and chains their fingerprint: one rewritten
    while the run drafted would be sealed as planned, and verify would vouch for it. None
    where there is nothing to check against: a run planned before the chain, or chained
    under another key than this process's (the freeze's write refuses it for that key)."""
    with store.audit.reading():
        head = store.audit.head(run_id)
        if head is None or head.chain is None:
            return None
        signer = store.engine.signer if head.chain == ChainKind.KEYED else UNKEYED
        if head.chain == ChainKind.KEYED and signer.key_id != head.key_id:
            return None
        _refuse_if_any(run_id, list(verify_run(store.audit, head, signer).findings))
        return replay((), store.audit.events(run_id))


def _refuse_if_any(run_id: str, findings: Sequence[Difference]) -> None:
    if findings:
        named = "; ".join(f"{d.row}: {d.column or d.change.value}" for d in findings[:3])
        more = f" and {len(findings) - 3} more" if len(findings) > 3 else ""
        raise Refused(
            f"run {run_id}: what its notifications are made of was changed after it was "
            f"recorded ({named}{more}), so its drafts were not frozen into notifications "
            "and nothing was sent."
        ).advise(NextStep.VERIFY, run_id)


def _refuse_if_changed(chained: Rebuilt, run: Run, drafts: Sequence[StoredDraft]) -> None:
    """The drafts and the run as the freeze read them (after the check, in reads of their
    own) against what was chained: what is frozen is what was checked."""
    if chained.inputs is None:
        return  # drafting began before its inputs were chained
    records = [DraftRecord(d.seq, d.state, d.source, d.subject, d.body) for d in drafts]
    inputs = DraftingInputs()
    for draft in records:
        inputs.add(draft.source)
    found = compare_drafts(records, chained.drafts, every_draft_chained=True)
    if inputs.result(run.options, run.channel_snapshot, run.key_nonce) != chained.inputs:
        found.append(Difference(Table.DRAFTS, "the run's rows", Change.DIFFERS, "inputs"))
    _refuse_if_any(run.run_id, found)


def freeze(store: Store, run_id: str, config: Config, then: RunTrigger | None) -> Plan:
    """Every row drafted (or failed): compute the intents from the stored drafts, in order,
    and store them with the fingerprint in one transaction. Rows whose draft failed are not
    planned; `then` (request_approval) moves the run in the same transaction. Each row was
    scheduled when its file was read (send --not-before, --tz, --window, its own columns):
    its start time is moved on to now, as a plain send planning it now would set it."""
    run = store.core.get_run(run_id)
    drafts = store.drafts.drafts(run_id)
    refuse_if_altered(store, run, drafts)
    now = clock.now()
    template_options = run.options.get("template")
    template = (
        from_sources(template_options["subject"], template_options["body"], "stored template")
        if template_options
        else None
    )
    rows: list[BatchRow] = []
    failed: dict[int, str] = {}
    identities: dict[int, str] = {}
    for stored in drafts:
        if stored.state == "pending":
            continue
        row = schedule.retime(row_from_source(stored.source), now)
        identities[row.seq] = source_identity(row)
        if stored.state == "failed":
            # Planned as it came, then failed with its reason in the same transaction: a
            # row whose draft failed counts as failed, and a later send plans it again.
            failed[stored.seq] = f"draft failed: {stored.error}"
            rows.append(row)
            continue
        draft = {"subject": str(stored.subject), "body": str(stored.body)}
        try:
            rows.append(apply_draft(row, draft, template))
        except DraftRejected as exc:
            store.drafts.fail_draft(run_id, stored.seq, str(exc), expected="drafted")
            failed[stored.seq] = f"draft failed: {exc}"
            rows.append(row)
    plan = make_plan(
        rows,
        config,
        run_id,
        snapshot=run.channel_snapshot,
        nonce=run.key_nonce,
        identities=identities,
    )
    try:
        store.drafts.freeze_plan(
            run_id, plan.fingerprint, plan.content_fingerprint, plan.items, then, failed
        )
    finally:
        plan.close()
    return plan
