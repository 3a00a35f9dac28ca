"""`send --compose --batch-api`: drafting through the Message Batches API, each chunk of
rows a durable intent (docs/guarantees.md, "Drafts through Message Batches").

Creating a batch is a paid side effect without an idempotency key, so a chunk is handled as
a send is: its intent first (rows, digest of its requests, a time lower bound: `creating`),
then `create`, then the receipt (batch id: `submitted`). Results are stored by custom_id as
they stream, each only if its row has no draft yet, so streaming again after a crash stores
nothing twice; the chunk is `done` once all are stored. On resume a chunk still `creating`
is settled by asking: batches created since its time bound with as many requests, adopted if
their results carry the chunk's custom_ids; created again only when none can be ours (or
when the operator chose `--recreate`). A batch not ended yet can only be recognised by its
results, so such a candidate is waited for.

Imported only when drafting: it loads the SDK.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anthropic
import tenacity
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from anthropic.types.messages.batch_create_params import Request

from notifier.content.batch_csv import BatchRow
from notifier.content.claude_batch_api import (
    cancel_batches,
    carries,
    custom_id_of,
    custom_prefix,
    listed_since,
    nothing_made,
)
from notifier.content.claude_client import claude_client
from notifier.content.claude_messages import (
    _api_message,
    _transient,
    _wait_honouring_retry_after,
    parse,
    stop_on_long_retry_after,
    without_key,
)
from notifier.content.claude_messages import request_params as params_of
from notifier.content.compose import (
    KEY_ENV,
    ComposeStopped,
    DraftProgress,
    DraftRejected,
    Settings,
    row_from_source,
)
from notifier.domain.errors import NeedsAttention, NextStep
from notifier.domain.intent import canonical_json
from notifier.domain.records import Run
from notifier.engine import crash
from notifier.engine.membership import Lease
from notifier.engine.run_control import RunControl
from notifier.store import Store

CHUNK_ROWS = 2000  # rows per batch: a fiftieth of the API's 100,000 requests per batch
MAX_ROUNDS = 4  # chunks a row may go through (expired, canceled, transient) in one command
CREATE_ATTEMPTS = 3  # creates of one chunk left unanswered in one command, each asked after
POLL_FIRST_S = 5.0
POLL_MAX_S = 60.0
POLL_ENV = "NOTIFIER_BATCH_POLL_S"  # rehearsals: the first poll interval, in seconds
CLOCK_SKEW = timedelta(minutes=5)  # the API's clock may run behind ours by this much
PERMANENT_ERRORS = ("invalid_request_error",)  # the row's request itself is wrong
T = TypeVar("T")


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM seen while drafting through batches: stop where it is safe."""


class _CreateInDoubt(Exception):
    """`create` failed in a way that does not prove nothing was made (no answer, a timeout,
    a 5xx or 529): the chunk's batch may exist, so it is settled by asking, never retried."""


class DraftingCancelled(NeedsAttention):
    """`notifier cancel` during drafting: the submitted batches were cancelled."""


class BatchDrafting:
    def __init__(
        self,
        store: Store,
        run: Run,
        settings: Settings,
        key: str,
        say: Callable[[str], None],
        lease: Lease,
        interrupted: RunControl | None = None,
        advance: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.store, self.run, self.settings, self.say = store, run, settings, say
        self.lease = lease  # its version fences every chunk write; create needs it surely held
        self.interrupted = interrupted if interrupted is not None else RunControl()
        self.advance = advance
        self.client = claude_client(key, max_retries=0, timeout=300.0)
        self.prefix = custom_prefix(run)
        self.crash = crash.from_env()
        self.poll_first = _poll_first()
        self.sources = {d.seq: d.source for d in store.drafts.drafts(run.run_id)}

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ the rounds

    def draft(self, rows_per_chunk: int) -> DraftProgress:
        """Settle, submit, wait, stream, until no row is left or MAX_ROUNDS chunks passed."""
        run_id = self.run.run_id
        try:
            for _ in range(MAX_ROUNDS):
                for chunk in self.store.chunks.chunks(run_id, ["creating"]):
                    self._check_interrupted()
                    self._settle(chunk.chunk)
                self._submit_new(rows_per_chunk)
                submitted = self.store.chunks.chunks(run_id, ["submitted"])
                if not submitted:
                    break
                for chunk in submitted:
                    assert chunk.batch_id is not None
                    self._wait_ended(chunk.batch_id)
                    self._stream(chunk.chunk, chunk.batch_id)
        except ComposeStopped as exc:
            return self._progress(exc)
        except _Interrupted:
            left = len(self.store.chunks.chunks(run_id, ["submitted"]))
            self.store.drafts.note_drafting(
                run_id,
                "drafting_interrupted",
                {"signal": self.interrupted.signal_name, "batches_left": left},
            )
            return self._progress(None, interrupted=True)
        return self._progress(None)

    def _progress(
        self, stopped: ComposeStopped | None, *, interrupted: bool = False
    ) -> DraftProgress:
        summary = self.store.drafts.draft_summary(self.run.run_id)
        return DraftProgress(
            summary["drafted"],
            summary["failed"],
            summary["pending"],
            stopped,
            self.interrupted if interrupted else None,
        )

    def _check_interrupted(self) -> None:
        """After Ctrl-C or SIGTERM: nothing more is created, polled or read. A `create`
        under way when the signal came has ended and its batch id is recorded (the signal
        does not cut a call short), so every batch paid for is known to `resume`."""
        if self.interrupted.signalled:
            raise _Interrupted

    def _submit_new(self, rows_per_chunk: int) -> None:
        """Chunk the rows without a draft and outside any open chunk: intent, create,
        batch id, one chunk at a time."""
        run_id = self.run.run_id
        known = self.store.chunks.chunks(run_id)
        covered = {seq for c in known if c.state in ("creating", "submitted") for seq in c.seqs}
        pending = [seq for seq, _ in self.store.drafts.pending_drafts(run_id) if seq not in covered]
        number = max((c.chunk for c in known), default=0)
        for start in range(0, len(pending), rows_per_chunk):
            seqs = pending[start : start + rows_per_chunk]
            self._check_interrupted()
            number += 1
            requests = self._requests(number, seqs, self.settings.model)
            not_before = (datetime.now(UTC) - CLOCK_SKEW).isoformat()
            self.store.chunks.record_chunk(
                run_id, number, seqs, _digest(requests), self.settings.model, not_before,
                self.lease.version,
            )  # fmt: skip
            self._at("after-chunk-intent", number)
            since = datetime.fromisoformat(not_before)
            self._create_or_adopt(number, requests, since, ask_first=False, note=None)

    def _create_or_adopt(
        self,
        number: int,
        requests: list[Request],
        since: datetime,
        *,
        ask_first: bool,
        note: str | None,
    ) -> None:
        """Create the chunk's batch; when a create goes unanswered, ask (list the batches
        since its time bound, adopt ours) before creating again, CREATE_ATTEMPTS at most.
        The chunk stays `creating` throughout, so `resume` asks the same way."""
        for attempt in range(CREATE_ATTEMPTS):
            if ask_first:
                found = self._find(number, len(requests), since)
                if found is not None:
                    self.store.chunks.chunk_submitted(
                        self.run.run_id, number, found, created=False,
                        note="adopted after asking", lease_version=self.lease.version,
                    )  # fmt: skip
                    self.say(f"chunk {number}: batch {found} carries its custom_ids: adopted")
                    return
                self.say(
                    f"chunk {number}: no batch since its intent carries its custom_ids: creating"
                )
                note = "created after asking: none was ours"
            try:
                self._create(number, requests, note)
                return
            except _CreateInDoubt as exc:
                self.say(
                    f"chunk {number}: no answer to creating its batch ({exc}); asking whether "
                    "it was made before creating it again"
                )
            ask_first = True
            self._sleep(min(POLL_MAX_S, self.poll_first * 2**attempt))
            self._check_interrupted()
        raise ComposeStopped(
            f"chunk {number}: {CREATE_ATTEMPTS} attempts to create its batch went unanswered "
            "(the API may have made them); the chunk stays recorded as creating"
        ).advise(NextStep.RESUME_ASKS_FIRST)

    def _create(self, number: int, requests: list[Request], note: str | None) -> None:
        self.store.chunks.chunk_create_started(self.run.run_id, number, self.lease.version)
        if not self.lease.surely_valid():  # checked right before the paid call, as sends are
            raise ComposeStopped(
                f"chunk {number}: this process can no longer be sure it holds the run's lease "
                "(another may have taken the run over), so its batch was not created; the "
                "chunk stays recorded as creating"
            ).advise(NextStep.RESUME_DRAFTING)
        batch = self._create_once(requests)
        self._at("after-batch-create", number)
        self.store.chunks.chunk_submitted(
            self.run.run_id, number, batch.id, created=True, note=note,
            lease_version=self.lease.version,
        )  # fmt: skip
        self.say(f"chunk {number}: batch {batch.id} created ({len(requests)} rows)")

    # ------------------------------------------------------------------ settling a doubt

    def _settle(self, number: int) -> None:
        """A chunk left `creating`: its batch may exist. Adopt the one whose results carry
        its custom_ids; create it only when none can be ours, or the operator chose to."""
        [chunk] = [c for c in self.store.chunks.chunks(self.run.run_id) if c.chunk == number]
        requests = self._requests(number, chunk.seqs, chunk.model)
        if _digest(requests) != chunk.requests_digest:
            raise NeedsAttention(
                f"run {self.run.run_id}: chunk {number}'s requests no longer hash to the digest "
                "recorded before its batch was created, so whether a batch is ours cannot be "
                "told; nothing was created."
            ).advise(NextStep.STATUS, self.run.run_id)
        since = datetime.fromisoformat(chunk.not_before)
        note = "created again by --recreate" if chunk.recreate else None
        self._create_or_adopt(number, requests, since, ask_first=not chunk.recreate, note=note)

    def _find(self, number: int, count: int, since: datetime) -> str | None:
        candidates = self._call(lambda: listed_since(self.client, since, count))
        mine = self._mine(number)
        for batch_id in candidates:
            self.say(f"chunk {number}: batch {batch_id} may be its own; reading its results")
            self._wait_ended(batch_id)  # only its results can tell, once it has ended
            if carries(self._results(batch_id), mine):
                return batch_id
        return None

    # ------------------------------------------------------------------ waiting, results

    def _wait_ended(self, batch_id: str) -> MessageBatch:
        """Poll with backoff until the batch ends; `notifier cancel` meanwhile cancels it."""
        wait = self.poll_first
        while True:
            batch = self._call(lambda: self.client.messages.batches.retrieve(batch_id))
            status = getattr(batch, "processing_status", None)
            if status == "ended":
                return batch
            if not isinstance(status, str) or not status:
                # No batch (the SDK builds its objects without checking them): nothing to
                # wait for, and nothing known; the chunk stays as it is, for resume to ask.
                raise ComposeStopped(
                    f"the Message Batches API answered the status of batch {batch_id} with "
                    "something that is not a batch; drafting stopped with every chunk recorded"
                ).advise(NextStep.RESUME_DRAFTING)
            self._check_interrupted()
            if self.store.core.get_run(self.run.run_id).cancel_requested_at:
                raise self._cancel_open()
            self.interrupted.wait(wait)
            wait = min(POLL_MAX_S, wait * 1.5)

    def _cancel_open(self) -> DraftingCancelled:
        """After a `cancel` while drafting: the run's open batches cancelled, and the error
        that says so, or which chunks the API could not be asked about (left open)."""
        run_id = self.run.run_id
        left = cancel_batches(self.store, run_id, self.client, self.say)
        for chunk in left:
            self.say(f"{chunk}.")
        if not left:
            return DraftingCancelled(
                f"run {run_id}: cancel requested while drafting; the submitted batches were "
                "cancelled."
            )
        return DraftingCancelled(
            f"run {run_id}: cancel requested while drafting; the submitted batches were "
            f"cancelled but for {len(left)} chunk(s) the API could not be asked about, which "
            "stay open."
        ).advise(NextStep.CANCEL_AGAIN, run_id)

    def _results(self, batch_id: str) -> Iterable[MessageBatchIndividualResponse]:
        try:
            return self._call(lambda: list(self.client.messages.batches.results(batch_id)))
        except ValueError as exc:  # a line that is not JSON
            raise _unreadable(batch_id, exc) from exc

    def _stream(self, number: int, batch_id: str) -> None:
        """Store each result of the chunk's batch by custom_id (those already stored are
        left as they are), then mark the chunk done. Expired, canceled and transiently
        errored rows stay without a draft: a later chunk asks again."""
        run_id = self.run.run_id
        tally = {"drafted": 0, "failed": 0, "again": 0}
        try:
            self._store_results(batch_id, number, tally)
        except anthropic.APIError as exc:
            raise ComposeStopped(
                f"the results of batch {batch_id} (chunk {number}) broke off ({exc}); the "
                "results read are stored"
            ).advise(NextStep.RESUME_READS_AGAIN) from exc
        except ValueError as exc:  # a line that is not JSON: the API's bad answer
            raise _unreadable(batch_id, exc) from exc
        note = ", ".join(f"{n} {k}" for k, n in tally.items())
        self.store.chunks.end_chunk(run_id, number, "done", note, self.lease.version)
        self.say(f"chunk {number}: results stored ({note})")

    def _store_results(self, batch_id: str, number: int, tally: dict[str, int]) -> None:
        run_id, mine = self.run.run_id, self._mine(number)
        [chunk] = [c for c in self.store.chunks.chunks(run_id) if c.chunk == number]
        own = {str(seq): seq for seq in chunk.seqs}
        for entry in self._call(lambda: self.client.messages.batches.results(batch_id)):
            custom_id = custom_id_of(entry)
            if custom_id is None or not custom_id.startswith(mine):
                continue
            # Only a row this chunk asked for, named exactly as it was asked: a result for
            # another chunk's row, or no row at all, is no draft of any row (a bad answer).
            seq = own.get(custom_id.removeprefix(mine))
            if seq is None:
                tally["ignored"] = tally.get("ignored", 0) + 1
                continue
            # Read as the server's answer, whatever its shape: a result without its type or
            # error leaves its row undrafted, for a later chunk to ask again.
            result = getattr(entry, "result", None)
            kind = getattr(result, "type", None)
            error = getattr(getattr(result, "error", None), "error", None)
            if kind == "succeeded":
                try:
                    draft = parse(getattr(result, "message", None))  # type: ignore[arg-type]
                except DraftRejected as exc:
                    if self.store.drafts.fail_result(run_id, seq, str(exc), exc.usage):
                        self.advance(1)
                    tally["failed"] += 1
                else:
                    if self.store.drafts.save_result(run_id, seq, _as_dict(draft)):
                        self.advance(1)
                    tally["drafted"] += 1
            elif kind == "errored" and (why := getattr(error, "type", None)) in PERMANENT_ERRORS:
                said = getattr(error, "message", None)
                self.store.drafts.fail_result(run_id, seq, f"{why}: {without_key(str(said))}")
                tally["failed"] += 1
            else:
                tally["again"] += 1  # expired, canceled, or a transient error
            self._at("mid-stream", seq)
            self._check_interrupted()  # the chunk stays submitted: resume reads it again

    # ------------------------------------------------------------------ helpers

    def _mine(self, number: int) -> str:
        """The custom_id prefix of chunk `number`'s requests (a row's seq follows it)."""
        return f"{self.prefix}_{number}_"

    def _requests(self, number: int, seqs: Sequence[int], model: str) -> list[Request]:
        settings = Settings(self.settings.brief, model, self.settings.columns, True)
        return [
            {
                "custom_id": f"{self._mine(number)}{seq}",
                "params": params_of(settings, _row(self.sources[seq])),
            }
            for seq in seqs
        ]

    def _at(self, point: str, seq: int) -> None:
        if self.crash is not None:
            self.crash.at(point, [seq])

    def _sleep(self, seconds: float) -> None:
        self.interrupted.wait(seconds)  # a Ctrl-C ends a wait between retries at once

    def _create_once(self, requests: list[Request]) -> MessageBatch:
        """`batches.create`, retried only after an answer proving nothing was made (429);
        any other 4xx stops drafting; anything else is in doubt (_CreateInDoubt)."""
        retrying = self._retrying(tenacity.retry_if_exception_type(anthropic.RateLimitError))
        try:
            batch = retrying(lambda: self.client.messages.batches.create(requests=requests))
        except anthropic.APIError as exc:
            if self.interrupted.signalled:
                raise _Interrupted from exc  # the chunk stays creating: resume asks
            if nothing_made(exc):
                raise _stopped(exc) from exc
            raise _CreateInDoubt(without_key(str(exc))) from exc
        # A 200 whose body is no batch (no id, or not JSON: the SDK builds its objects
        # without checking them) proves nothing either way: a batch may have been made.
        batch_id = getattr(batch, "id", None)
        if not isinstance(batch_id, str) or not batch_id:
            raise _CreateInDoubt("the API answered without a batch id")
        return batch

    def _retrying(self, retry: tenacity.retry_base) -> tenacity.Retrying:
        """Retries of one API call: at most 8 tries, none after a signal or a Retry-After
        too long to wait (the row or chunk is left for resume), each wait its Retry-After."""
        return tenacity.Retrying(
            retry=retry,
            stop=(
                tenacity.stop_after_attempt(8)
                | _UntilSignalled(self.interrupted)
                | stop_on_long_retry_after
            ),
            wait=_wait_honouring_retry_after,
            sleep=self._sleep,
            reraise=True,
        )

    def _call(self, action: Callable[[], T]) -> T:
        """One API call, transient failures retried honouring retry-after; a refused key
        stops drafting for every row."""
        retrying = self._retrying(tenacity.retry_if_exception(_transient))
        try:
            return retrying(action)
        except anthropic.APIError as exc:
            if self.interrupted.signalled:
                raise _Interrupted from exc  # no retry after Ctrl-C: resume asks again
            raise _stopped(exc) from exc


class _UntilSignalled(tenacity.stop.stop_base):
    """No retry after Ctrl-C or SIGTERM."""

    def __init__(self, control: RunControl) -> None:
        self.control = control

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.control.signalled


def _stopped(exc: anthropic.APIError) -> ComposeStopped:
    """Why drafting stopped, for a call that failed for good: a refused key, or an API that
    stayed unwilling or out of reach through every retry."""
    if isinstance(exc, (anthropic.AuthenticationError, anthropic.PermissionDeniedError)):
        return ComposeStopped(
            f"the Message Batches API refused the key in {KEY_ENV} ({exc.status_code}: "
            f"{_api_message(exc)}); drafting stopped"
        ).advise(NextStep.FIX_KEY_THEN_RESUME)
    if isinstance(exc, anthropic.APIStatusError):
        return ComposeStopped(
            f"the Message Batches API answered {exc.status_code} ({_api_message(exc)}); "
            "drafting stopped with every chunk recorded"
        ).advise(NextStep.RESUME_DRAFTING)
    return ComposeStopped(
        f"cannot reach the Message Batches API ({exc}); drafting stopped with every chunk recorded"
    ).advise(NextStep.RESUME_DRAFTING)


def _unreadable(batch_id: str, exc: ValueError) -> ComposeStopped:
    return ComposeStopped(
        f"the results of batch {batch_id} are not the JSON Lines the API describes ({exc}); "
        "the results read before are stored, the rows without a draft stay undrafted"
    ).advise(NextStep.RESUME_READS_AGAIN)


def _digest(requests: list[Request]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(requests).encode("utf-8")).hexdigest()


def _row(source: str) -> BatchRow:
    return row_from_source(source)


def _as_dict(draft: Any) -> dict[str, Any]:
    return {
        "subject": draft.subject,
        "body": draft.body,
        "model": draft.model,
        "input_tokens": draft.input_tokens,
        "output_tokens": draft.output_tokens,
    }


def _poll_first() -> float:
    try:
        return max(0.01, float(os.environ.get(POLL_ENV, POLL_FIRST_S)))
    except ValueError:
        return POLL_FIRST_S
