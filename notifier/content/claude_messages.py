"""The Messages API client that drafts for compose.py, through the `anthropic` SDK.

One tool whose input schema is the draft (`subject`, `body`), and `tool_choice` forcing it:
structured output, not prose to parse. The SDK's own retries are off (`max_retries=0`) so
that tenacity alone decides: 429, 529 and 5xx are retried honouring `retry-after`; 401/403
stop everything; a malformed answer fails that row only.

Imported only when drafting (`send --compose`, `resume` of a run still drafting): loading the
SDK costs about a second, which no other command should pay.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import TypeGuard

import anthropic
import tenacity
from anthropic.types import Message, ToolParam
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from tenacity import RetryCallState

from notifier.content.batch_csv import BatchRow
from notifier.content.claude_client import claude_client
from notifier.content.compose import (
    KEY_ENV,
    ComposeStopped,
    ComposeUsage,
    Deferral,
    Draft,
    DraftDeferred,
    DraftRejected,
    Settings,
    check_draft_text,
    prompt_row,
)
from notifier.content.text_rules import SURROGATE
from notifier.domain import waits
from notifier.domain.errors import NextStep
from notifier.domain.redact import literal, redacted

MAX_ATTEMPTS = 5
MAX_TOKENS = 1024
BACKOFF = tenacity.wait_random_exponential(multiplier=0.5, max=30)
LONG_RETRY_AFTER_S = 300.0  # a longer Retry-After leaves the row (or the chunk) for resume
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


class Drafter:
    def __init__(self, settings: Settings, key: str) -> None:
        self.settings = settings
        # max_retries=0: tenacity owns retries (and honours retry-after); two retry layers
        # would multiply the attempts and hide the waits.
        self.client = claude_client(key, max_retries=0, timeout=120.0)
        self.stopping = threading.Event()

    def close(self) -> None:
        self.client.close()

    def stop(self) -> None:
        """Ctrl-C: no new request and no further retry; a wait in progress ends now."""
        self.stopping.set()

    def draft(self, row: BatchRow) -> Draft:
        """One draft, retrying transient errors; DraftRejected or ComposeStopped otherwise."""
        if self.stopping.is_set():
            raise DraftDeferred("drafting was interrupted", Deferral.INTERRUPTED)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transient),
            stop=(
                tenacity.stop_after_attempt(MAX_ATTEMPTS)
                | tenacity.stop_when_event_set(self.stopping)
                | stop_on_long_retry_after
            ),
            wait=_wait_honouring_retry_after,
            sleep=self._sleep,
            reraise=True,
        )
        try:
            message = retrying(self._request, row)
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
            raise ComposeStopped(
                f"the Messages API refused the key in {KEY_ENV} ({exc.status_code}: "
                f"{_api_message(exc)}); drafting stopped for every row"
            ).advise(NextStep.FIX_KEY_THEN_RESUME) from exc
        except anthropic.NotFoundError as exc:
            raise ComposeStopped(
                f"the Messages API does not know model {self.settings.model!r} "
                f"({_api_message(exc)}); drafting stopped"
            ).advise(NextStep.RESUME_WITH_MODEL) from exc
        except anthropic.APIStatusError as exc:
            if _transient(exc):
                why = (
                    Deferral.SERVER_ERROR
                    if exc.status_code not in (429, 529)
                    else (Deferral.RATE_LIMITED)
                )
                raise DraftDeferred(f"{exc.status_code}: {_api_message(exc)}", why) from exc
            raise DraftRejected(f"{exc.status_code}: {_api_message(exc)}") from exc
        except anthropic.APIConnectionError as exc:
            raise DraftDeferred(
                f"cannot reach the Messages API: {exc}", Deferral.UNREACHABLE
            ) from exc
        return parse(message)

    def check_model(self) -> None:
        """Before anything is stored: ask the Models API whether it knows the model; a 404
        is a usage error (exit 2). Anything else (unreachable, refused) proves nothing here:
        the first draft request will say."""
        try:
            self.client.models.retrieve(self.settings.model)
        except anthropic.NotFoundError as exc:
            raise UnknownModel(
                f"the Claude API does not know model {self.settings.model!r} "
                f"({_api_message(exc)}); nothing was stored. Name a model the API lists "
                "(e.g. `--model claude-sonnet-4-5`) and run the command again."
            ) from exc
        except anthropic.APIError:
            return

    def _sleep(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    def _request(self, row: BatchRow) -> Message:
        return self.client.messages.create(**request_params(self.settings, row))


class UnknownModel(ComposeUsage):
    """The API does not know the model: exit 2, nothing stored."""


def request_params(settings: Settings, row: BatchRow) -> MessageCreateParamsNonStreaming:
    """One row's Messages request, as the synchronous path sends it (batch requests carry
    the same parameters)."""
    return {
        "model": settings.model,
        "max_tokens": MAX_TOKENS,
        "system": INSTRUCTIONS + settings.brief,
        "messages": [
            {"role": "user", "content": "Recipient row:\n" + prompt_row(row, settings.columns)}
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": TOOL_NAME},
    }


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return isinstance(exc, anthropic.APIConnectionError)


def _retry_after(state: RetryCallState) -> float | None:
    """The seconds the last answer's Retry-After asks for; None without one as a number (an
    HTTP-date: the backoff stands)."""
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, anthropic.APIStatusError):
        header = error.response.headers.get("retry-after")
        with suppress(ValueError):
            return float(header) if header else None
    return None


def _wait_honouring_retry_after(state: RetryCallState) -> float:
    wait = float(BACKOFF(state))
    after = _retry_after(state)
    if after is not None and math.isfinite(after):
        wait = max(wait, after)
    return waits.scaled(wait)  # the test switch (waits.py)


class _StopOnLongRetryAfter(tenacity.stop.stop_base):
    """No retry when the answer asks for a longer wait than drafting makes (or one that is
    no number of seconds at all, `inf`): the API asks to come back later, so the row is left
    for `resume`, as a long Retry-After pauses a send."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        after = _retry_after(retry_state)
        return after is not None and not after <= LONG_RETRY_AFTER_S


stop_on_long_retry_after = _StopOnLongRetryAfter()


def _api_message(exc: anthropic.APIStatusError) -> str:
    """What the API said, without the key if it quoted it back."""
    body = exc.body
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return without_key(str(error["message"]))
    return without_key(str(exc.message))


def without_key(text: str) -> str:
    """`text` (an API error, said or stored) without the API key in it, shown literally."""
    return literal(redacted(text, [os.environ.get(KEY_ENV)]))


def parse(message: Message) -> Draft:
    """The tool call's input as a Draft, or DraftRejected saying what was wrong (carrying
    the answer's usage: an unusable answer is paid for all the same). The answer is read as
    a server's, not trusted to be the Message the SDK describes: an answer of another shape
    (no usage, no content, not an object at all) fails its row, never the command."""
    usage = _usage(message)
    try:
        return _parse(message, usage)
    except DraftRejected as exc:
        raise DraftRejected(str(exc), usage) from None


def _usage(message: object) -> tuple[str, int, int] | None:
    """(model, tokens in, tokens out), or None when the answer does not say them as such."""
    model = getattr(message, "model", None)
    usage = getattr(message, "usage", None)
    given, taken = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
    if isinstance(model, str) and not SURROGATE.search(model) and _count(given) and _count(taken):
        return model, given, taken
    return None


def _count(n: object) -> TypeGuard[int]:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _parse(message: Message, usage: tuple[str, int, int] | None) -> Draft:
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        raise DraftRejected("malformed answer: it is not a message with content blocks")
    calls = [
        block
        for block in content
        if getattr(block, "type", None) == "tool_use" and getattr(block, "name", None) == TOOL_NAME
    ]
    if not calls:
        kinds = ", ".join(str(getattr(block, "type", "?")) for block in content) or "nothing"
        raise DraftRejected(f"malformed answer: no {TOOL_NAME} tool call (got {kinds})")
    given = getattr(calls[0], "input", None)
    if not isinstance(given, Mapping):
        raise DraftRejected("malformed answer: the tool input is not an object")
    subject, body = given.get("subject"), given.get("body")
    if not isinstance(subject, str) or not isinstance(body, str):
        raise DraftRejected("malformed answer: the tool input lacks a text subject and body")
    if usage is None:
        raise DraftRejected("malformed answer: it does not say its model and token usage")
    # A subject is one line (it becomes an e-mail header): a line break the model put in
    # it is folded rather than refused; control characters are refused, as in a CSV.
    subject, body = check_draft_text(subject, body)
    model, input_tokens, output_tokens = usage
    return Draft(subject, body, model, input_tokens, output_tokens)
