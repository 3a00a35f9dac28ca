"""--log-format json: one JSON object per event on stderr, for a log pipeline (stdout keeps
the reports). Events: plan, attempt_started, answer, outcome (of a send, and of a settlement
by a status query or by a deadline), gate, and the run's ending (complete, pause, halt,
cancel, the state another worker left it in, or lease_lost).

stdlib `logging` with a small formatter, not structlog: the events are a fixed handful
emitted from one module, so a processor chain would buy nothing, and a dependency fewer is
one fewer thing to install on every worker. Writes go through a logging handler, whose lock
keeps the lines of concurrent senders whole.

What a line never carries: a secret (no channel definition is logged), the recipient, the
subject, the body or the row's other columns, unless --log-bodies asks for them (then on
attempt_started only). The idempotency key is there: it is what the downstream logs, so
it joins the two."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from notifier.domain import clock
from notifier.domain.suppression import domain_key
from notifier.observe import Observer, answer_outcome

if TYPE_CHECKING:
    from notifier.domain.records import Item, Outcome
    from notifier.engine.coordination import RunResult
    from notifier.engine.judging import Sent

LOGGER = "notifier.events"
# The run's ending, by the state it ended in: the event's name.
_ENDINGS = {"completed": "complete", "paused": "pause", "halted": "halt", "cancelled": "cancel"}


def json_line(event: str, fields: Mapping[str, Any], at: datetime | None = None) -> str:
    """One event of a JSON log: `ts` (UTC, milliseconds; now unless `at`), `event`, then
    `fields`, on one line. The Unicode line separators (U+2028, U+2029, NEL) are valid JSON
    unescaped, but readers that split lines as Unicode does (str.splitlines, many log
    shippers) would cut the event there: they are written escaped."""
    at = at or datetime.now(UTC)
    line: dict[str, Any] = {
        "ts": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": event,
        **fields,
    }
    text = json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.translate(_SEPARATORS)


_SEPARATORS = {0x2028: "\\u2028", 0x2029: "\\u2029", 0x85: "\\u0085"}


class JsonFormatter(logging.Formatter):
    """A record's `fields` as one JSON event (json_line)."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        return json_line(record.getMessage(), getattr(record, "fields", {}), at)


class JsonLog(Observer):
    """The events of one command, to stderr as JSON lines."""

    def __init__(self, *, bodies: bool = False) -> None:
        self.bodies = bodies
        self.run_id = ""
        self._handler = logging.StreamHandler(sys.stderr)
        self._handler.setFormatter(JsonFormatter())
        self._log = logging.getLogger(LOGGER)
        self._log.setLevel(logging.INFO)
        self._log.propagate = False  # never through a root handler, as plain text
        self._log.addHandler(self._handler)

    def emit(self, event: str, **fields: Any) -> None:
        self._log.info(event, extra={"fields": {"run_id": self.run_id, **fields}})

    def planned(
        self, run_id: str, total: int, per_channel: dict[str, int], event: str = "plan"
    ) -> None:
        self.run_id = run_id
        self.emit(event, items=total, channels=dict(sorted(per_channel.items())))

    def attempt_started(self, item: Item) -> None:
        extra: dict[str, Any] = {}
        if self.bodies:
            extra = {
                "to": item.target,
                "subject": item.payload.get("subject"),
                "body": item.payload.get("body"),
            }
        self.emit("attempt_started", **_item(item), **extra)

    def answered(self, item: Item, result: Sent, started: datetime | None) -> None:
        outcome = answer_outcome(result)
        if outcome is None or started is None:
            return  # no request left: its outcome event says what was made of it
        fields = _item(item)
        fields["outcome"] = outcome
        status = getattr(result, "http_status", None)
        if status is not None:
            fields["http_status"] = status
        fields["duration_ms"] = round((clock.now() - started).total_seconds() * 1000, 1)
        self.emit("answer", **fields)

    def recorded(self, done: Sequence[tuple[Item, object]], outcomes: Sequence[Outcome]) -> None:
        by_seq = {item.seq: item for item, _ in done}
        for outcome in outcomes:
            item = by_seq.get(outcome.seq)
            fields: dict[str, Any] = _item(item) if item is not None else {"seq": outcome.seq}
            fields["outcome"] = outcome.trigger.value
            if outcome.attempt_outcome is not None:
                fields["attempt_outcome"] = outcome.attempt_outcome
            if outcome.error:
                # The text the human report prints: the receiver's reply, never the row's.
                # A reply may echo the recipient (an SMTP 5.1.x at RCPT names it): left out
                # unless --log-bodies asks for recipients.
                error = outcome.error
                if item is not None and not self.bodies:
                    error = _without_recipient(error, item)
                fields["error"] = error
            self.emit("outcome", **fields)

    def gated(self, channel: str, now: float, until: float) -> None:
        self.emit("gate", channel=channel, seconds=round(max(0.0, until - now), 3))

    def ended(self, result: RunResult) -> RunResult:
        state = result.state.value
        lost = result.stop.value == "lease_lost"  # the run goes on, held by another
        self.emit(
            "lease_lost" if lost else _ENDINGS.get(state, state),
            state=state,
            stop=result.stop.value,
            reason=result.reason,
            counts=result.counts.as_json(),
            paused_until=result.paused_until,
        )
        return result

    def close(self) -> None:
        self._handler.flush()
        self._log.removeHandler(self._handler)


def _without_recipient(text: str, item: Item) -> str:
    """`text` with the item's recipient (in any case, trimmed or not, and as the wire spells
    an internationalised domain: punycode, which a relay's reply quotes) as `<recipient>`."""
    forms = {item.target, item.target.strip()}
    local, at, domain = item.target.strip().rpartition("@")
    if at and not domain.isascii():
        with suppress(UnicodeError, ValueError):
            forms.add(f"{local}@{domain_key(domain)}")
    for form in sorted(forms, key=len, reverse=True):
        if form:
            text = re.sub(re.escape(form), "<recipient>", text, flags=re.IGNORECASE)
    return text


def _item(item: Item) -> dict[str, Any]:
    """The fields that name an item and its attempt, never its content."""
    return {
        "seq": item.seq,
        "item": item.item_id,
        "key": item.idempotency_key,
        "channel": item.channel,
        "attempt": item.attempts,
    }
