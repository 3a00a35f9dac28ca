"""`send --compose BRIEF`: Claude drafts each row's subject and body (DESIGN section 10).

Drafting happens while planning. Every draft is stored with its row (with the model and the
token usage) as soon as it arrives; only when no row is left to draft are the intents, their
digests and the run's fingerprint computed from the stored drafts ("frozen"). A draft has no
side effect, so a crash before one is stored just asks again; a stored draft is never asked
for again, so `resume` never changes a digest.

The request goes through the `anthropic` SDK's Messages API with one tool whose input schema
is the draft (`subject`, `body`) and `tool_choice` forcing it: structured output, not prose to
parse. The SDK's own retries are off (`max_retries=0`) so that tenacity alone decides: 429,
529 and 5xx are retried honouring `retry-after`; 401/403 stop everything; a malformed answer
fails that row only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anthropic
import tenacity
from anthropic.types import Message, MessageParam, ToolChoiceToolParam, ToolParam
from tenacity import RetryCallState

from .batch import BatchRow
from .config import Config
from .intent import canonical_json
from .plan import Plan, make_plan
from .records import Run
from .store import Store
from .template import Template, from_sources, render_row, render_rows

KEY_ENV = "ANTHROPIC_API_KEY"
DEFAULT_MODEL = "claude-sonnet-5"
CONCURRENCY = 4  # requests in flight at once while drafting
DRY_RUN_ROWS = 3
MAX_ATTEMPTS = 5
MAX_TOKENS = 1024
BACKOFF = tenacity.wait_random_exponential(multiplier=0.5, max=30)
TOOL_NAME = "notification_draft"
TOOL: ToolParam = {
    "name": TOOL_NAME,
    "description": "The notification for this one recipient, ready to send as plain text.",
    "input_schema": {
        "type": "object",
        "properties": {
            "subject": {"type": "string", "description": "One line, no line breaks."},
            "body": {"type": "string", "description": "Plain text body."},
        },
        "required": ["subject", "body"],
    },
}
INSTRUCTIONS = (
    "You draft one notification for one recipient, following the brief below and using the "
    "recipient's row. Answer only by calling the notification_draft tool.\n\nBrief:\n"
)


class ComposeUsage(Exception):
    """Cannot start drafting (no key, empty brief): exit 2, nothing stored."""


class ComposeStopped(Exception):
    """Drafting stopped for every row (401/403, unknown model): exit 3; drafts already
    stored are kept and `resume` continues once the cause is fixed."""


class DraftRejected(Exception):
    """This row's answer was unusable: the row fails, the others go on."""


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

    def as_options(self) -> dict[str, str]:
        return {"brief": self.brief, "model": self.model}

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Settings:
        compose = options["compose"]
        return cls(brief=str(compose["brief"]), model=str(compose["model"]))


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
    return json.dumps(asdict(row), sort_keys=True, ensure_ascii=False)


def row_from_source(source: str) -> BatchRow:
    return BatchRow(**json.loads(source))


class Drafter:
    def __init__(self, settings: Settings, key: str) -> None:
        self.settings = settings
        # max_retries=0: tenacity owns retries (and honours retry-after); two retry layers
        # would multiply the attempts and hide the waits. The base URL comes from
        # ANTHROPIC_BASE_URL when set (tests point it at a fake on 127.0.0.1).
        self.client = anthropic.Anthropic(api_key=key, max_retries=0, timeout=120.0)

    def close(self) -> None:
        self.client.close()

    def draft(self, row: BatchRow) -> Draft:
        """One draft, retrying transient errors; DraftRejected or ComposeStopped otherwise."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transient),
            stop=tenacity.stop_after_attempt(MAX_ATTEMPTS),
            wait=_wait_honouring_retry_after,
            reraise=True,
        )
        try:
            message = retrying(self._request, row)
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise ComposeStopped(
                f"the Messages API refused the key in {KEY_ENV} ({exc.status_code}: "
                f"{_api_message(exc)}); drafting stopped for every row. Fix the key, then "
                "run `notifier resume` to draft the rest."
            ) from exc
        except anthropic.NotFoundError as exc:
            raise ComposeStopped(
                f"the Messages API does not know model {self.settings.model!r} "
                f"({_api_message(exc)}); drafting stopped."
            ) from exc
        except anthropic.APIStatusError as exc:
            if _transient(exc):
                raise  # retries ran out: the row stays undrafted, resume tries again
            raise DraftRejected(f"{exc.status_code}: {_api_message(exc)}") from exc
        return _parse(message)

    def _request(self, row: BatchRow) -> Message:
        messages: list[MessageParam] = [
            {"role": "user", "content": "Recipient row:\n" + prompt_row(row)}
        ]
        choice: ToolChoiceToolParam = {"type": "tool", "name": TOOL_NAME}
        return self.client.messages.create(
            model=self.settings.model,
            max_tokens=MAX_TOKENS,
            system=INSTRUCTIONS + self.settings.brief,
            messages=messages,
            tools=[TOOL],
            tool_choice=choice,
        )


def prompt_row(row: BatchRow) -> str:
    """The row as the model sees it: its columns as canonical JSON."""
    values: dict[str, Any] = dict(row.data)
    values.update(id=row.item_id, to=row.to, subject=row.subject, body=row.body)
    if row.not_after:
        values["not_after"] = row.not_after
    return canonical_json(values)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return isinstance(exc, anthropic.APIConnectionError)


def _wait_honouring_retry_after(state: RetryCallState) -> float:
    wait = float(BACKOFF(state))
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, anthropic.APIStatusError):
        header = error.response.headers.get("retry-after")
        with suppress(ValueError):  # an HTTP-date: the backoff stands
            wait = max(wait, float(header)) if header else wait
    return wait


def _api_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(exc.message)


def _parse(message: Message) -> Draft:
    """The tool call's input as a Draft, or DraftRejected saying what was wrong."""
    calls = [
        block
        for block in message.content
        if block.type == "tool_use" and getattr(block, "name", None) == TOOL_NAME
    ]
    if not calls:
        kinds = ", ".join(block.type for block in message.content) or "nothing"
        raise DraftRejected(f"malformed answer: no {TOOL_NAME} tool call (got {kinds})")
    given = getattr(calls[0], "input", None)
    if not isinstance(given, Mapping):
        raise DraftRejected("malformed answer: the tool input is not an object")
    subject, body = given.get("subject"), given.get("body")
    if not isinstance(subject, str) or not isinstance(body, str):
        raise DraftRejected("malformed answer: the tool input lacks a text subject and body")
    # A subject is one line (it becomes an e-mail header): fold any line break the model
    # put in it rather than refuse an otherwise good draft.
    subject = " ".join(subject.split())
    if not subject or not body.strip():
        raise DraftRejected("malformed answer: the subject or the body is empty")
    usage = message.usage
    return Draft(subject, body, message.model, usage.input_tokens, usage.output_tokens)


# ---------------------------------------------------------------------- drafting a run


@dataclass(frozen=True)
class Progress:
    drafted: int
    failed: int
    pending: int
    stopped: str | None = None  # why drafting stopped for every row


def draft_pending(
    store: Store,
    run_id: str,
    drafter: Drafter,
    say: Callable[[str], None],
    concurrency: int = CONCURRENCY,
) -> Progress:
    """Draft every row of the run that has no draft yet, `concurrency` at a time, storing
    each result as it arrives (this thread writes; the pool only talks to the API)."""
    pending = store.pending_drafts(run_id)
    stopped: str | None = None
    deferred = 0
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="draft") as pool:
        rows = [(seq, row_from_source(source)) for seq, source in pending]
        futures: dict[Future[Draft], tuple[int, BatchRow]] = {
            pool.submit(drafter.draft, row): (seq, row) for seq, row in rows
        }
        for future in as_completed(futures):
            seq, row = futures[future]
            try:
                draft = future.result()
            except ComposeStopped as exc:
                if stopped is None:
                    stopped = str(exc)
                    for other in futures:
                        other.cancel()  # not started yet: they stay undrafted
                continue
            except DraftRejected as exc:
                store.fail_draft(run_id, seq, str(exc))
                say(f"draft for item {row.item_id} (line {row.line}) failed: {exc}")
                continue
            except (anthropic.APIError, tenacity.RetryError) as exc:
                deferred += 1
                say(f"draft for item {row.item_id} not made yet: {exc}")
                continue
            store.save_draft(run_id, seq, asdict(draft))
    summary = store.draft_summary(run_id)
    return Progress(summary["drafted"], summary["failed"], summary["pending"], stopped)


def first_drafts(drafter: Drafter, rows: Sequence[BatchRow]) -> list[tuple[BatchRow, Draft | str]]:
    """--dry-run: drafts for the first rows, stored nowhere (a failure shows as its text)."""
    shown: list[tuple[BatchRow, Draft | str]] = []
    for row in rows:
        try:
            shown.append((row, drafter.draft(row)))
        except DraftRejected as exc:
            shown.append((row, f"draft failed: {exc}"))
    return shown


def check_template(template: Template, rows: Sequence[BatchRow], path: Path) -> None:
    """Before any token is spent: every row renders with a stand-in draft, so a missing
    column is a problem of its line now (exit 2, nothing stored), not after drafting."""
    stand_in = {"subject": "", "body": ""}
    render_rows(template, list(rows), path, {row.seq: stand_in for row in rows})


def apply_draft(row: BatchRow, draft: Mapping[str, str], template: Template | None) -> BatchRow:
    """The row as it will be sent: the draft, or the template rendered with `draft`."""
    if template is None:
        return BatchRow(
            row.line,
            row.seq,
            row.item_id,
            row.to,
            draft["subject"],
            draft["body"],
            row.channel,
            row.data,
            row.not_after,
        )
    result = render_row(template, row, draft)
    if isinstance(result, BatchRow):
        return result
    raise DraftRejected(result.message)


def freeze(store: Store, run_id: str, config: Config, then: str | None) -> Plan:
    """Every row drafted (or failed): compute the intents from the stored drafts, in order,
    and store them with the fingerprint in one transaction. Rows whose draft failed are not
    planned; `then` (request_approval) moves the run in the same transaction."""
    run = store.get_run(run_id)
    template_options = run.options.get("template")
    template = (
        from_sources(template_options["subject"], template_options["body"], "stored template")
        if template_options
        else None
    )
    rows: list[BatchRow] = []
    for stored in store.drafts(run_id):
        if stored.state != "drafted":
            continue
        row = row_from_source(stored.source)
        draft = {"subject": str(stored.subject), "body": str(stored.body)}
        try:
            rows.append(apply_draft(row, draft, template))
        except DraftRejected as exc:
            store.fail_draft(run_id, stored.seq, str(exc), expected="drafted")
    plan = make_plan(rows, config, run_id, snapshot=run.channel_snapshot)
    store.freeze_plan(run_id, plan.fingerprint, plan.items, then=then)
    return plan
