"""What the sandbox (sandbox.py) does wrong and what it remembers: the seeded fault model,
and the state behind its answers (idempotency keys, deliveries, counters), kept apart from
the HTTP server so the rules of a careful provider read without the wire.

Every answer is a `Reply` decided here under one lock; sandbox.py only reads requests and
writes replies."""

from __future__ import annotations

import copy
import enum
import hashlib
import json
import math
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

# The stats key under which non-idempotent deliveries without an Idempotency-Key count.
NO_KEY: Final = "-"


@dataclass(frozen=True)
class Faults:
    """What the sandbox does wrong, and how often. Rates are fractions of POSTs (0..1); at
    most one fault applies per POST, so the rates must add up to at most 1."""

    seed: int = 0
    latency_ms: float = 0.0
    fail_rate: float = 0.0
    throttle_rate: float = 0.0
    retry_after: float = 1.0
    error_rate: float = 0.0
    drop_rate: float = 0.0
    idempotent: bool = True
    force_status: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rates = {
            "throttle_rate": self.throttle_rate,
            "fail_rate": self.fail_rate,
            "error_rate": self.error_rate,
            "drop_rate": self.drop_rate,
        }
        for name, value in rates.items():
            if not 0.0 <= value <= 1.0:  # also rejects NaN
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        total = sum(rates.values())
        if total > 1.0 + 1e-9:
            raise ValueError(
                f"fault rates add up to {total:g}; at most one fault applies per request, "
                "so their sum must be at most 1"
            )
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"latency_ms must be a finite number >= 0, got {self.latency_ms}")
        if not (math.isfinite(self.retry_after) and self.retry_after >= 0):
            raise ValueError(f"retry_after must be a finite number >= 0, got {self.retry_after}")
        for item_id, status in self.force_status.items():
            if not 200 <= status <= 599:
                raise ValueError(f"force_status for {item_id!r} must be 200..599, got {status}")

    @property
    def retry_after_header(self) -> str:
        """`Retry-After` as RFC 9110 delay-seconds (digits only): whole values as they are,
        fractions rounded up, so the client never comes back sooner than configured."""
        return str(math.ceil(self.retry_after))


def payload_identity(body: Any) -> str:
    """`sha256:<hex>` over the canonical JSON of a request body (sorted keys, no whitespace,
    UTF-8): identifies "the same payload" when no `Notifier-Intent-Digest` header is sent."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _json_bytes(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


def json_reply(status: int, document: Any, *headers: tuple[str, str]) -> Reply:
    return Reply(status, _json_bytes(document), headers)


def error_reply(status: int, message: str, **extra: Any) -> Reply:
    return json_reply(status, {"error": message, **extra})


class Fault(enum.Enum):
    NONE = "none"
    FORCED = "forced"
    THROTTLE = "throttle"
    FAIL = "fail"
    ERROR = "error"
    DROP = "drop"


@dataclass
class KeyRecord:
    """Everything known about one idempotency key."""

    digest: str
    processing: bool
    first_id: str | None = None
    reply: Reply | None = None
    commits: int = 0
    replays: int = 0
    refused: int = 0


class State:
    """All shared state of one sandbox, guarded by one lock (never held while sleeping)."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.force_status = dict(faults.force_status)
        self.lock = threading.Lock()
        self.rng = random.Random(faults.seed)
        self.keys: dict[str, KeyRecord] = {}
        self.deliveries: list[dict[str, Any]] = []
        self.requests = 0
        self.faulted = 0
        self.dropped = 0
        self.connections = 0

    def decide(self, item_id: Any) -> tuple[Fault, Reply | None]:
        """The fault for one POST and, unless it is processed normally, its answer. Forced
        statuses are deterministic and draw nothing; every other POST draws exactly one
        number, so the sequence of decisions depends only on the seed and the requests."""
        faults = self.faults
        with self.lock:
            if isinstance(item_id, str | int) and not isinstance(item_id, bool):
                forced = self.force_status.get(str(item_id))
                if forced is not None:
                    self.faulted += 1
                    return Fault.FORCED, error_reply(forced, f"forced status {forced}")
            draw = self.rng.random()
            threshold = faults.throttle_rate
            if draw < threshold:
                self.faulted += 1
                return Fault.THROTTLE, json_reply(
                    429,
                    {"error": "throttled", "retry_after": faults.retry_after},
                    ("Retry-After", faults.retry_after_header),
                )
            threshold += faults.fail_rate
            if draw < threshold:
                self.faulted += 1
                return Fault.FAIL, error_reply(503, "service unavailable")
            threshold += faults.error_rate
            if draw < threshold:
                self.faulted += 1
                return Fault.ERROR, error_reply(500, "internal error")
            threshold += faults.drop_rate
            if draw < threshold:
                self.dropped += 1
                return Fault.DROP, None
            return Fault.NONE, None

    def claim(self, key: str, digest: str) -> Reply | None:
        """Idempotent mode: mark a new key as processing (None: the caller must commit), or
        answer a key seen before (replay, 422 for another payload, 409 while processing)."""
        with self.lock:
            record = self.keys.get(key)
            if record is None:
                self.keys[key] = KeyRecord(digest=digest, processing=True)
                return None
            if record.digest != digest:
                record.refused += 1
                return error_reply(
                    422,
                    "idempotency key already used with a different payload",
                    idempotency_key=key,
                )
            if record.processing or record.reply is None:
                record.refused += 1
                return error_reply(
                    409,
                    "a request with this idempotency key is still being processed",
                    idempotency_key=key,
                )
            record.replays += 1
            first = record.reply
            replayed = ("Idempotent-Replayed", "true")
            return Reply(first.status, first.body, (*first.headers, replayed))

    def commit(
        self,
        key: str | None,
        digest: str,
        body: dict[str, Any],
        raw: bytes,
        headers: dict[str, str],
    ) -> Reply:
        """Record one new delivery and count it under its key."""
        with self.lock:
            delivery_id = f"dlv_{len(self.deliveries) + 1}"
            reply = json_reply(
                201,
                {
                    "id": delivery_id,
                    "status": "delivered",
                    "idempotency_key": key,
                    "intent_digest": digest,
                },
            )
            self.deliveries.append(
                {
                    "id": delivery_id,
                    "idempotency_key": key,
                    "intent_digest": digest,
                    "body": body,
                    "raw_body": raw.decode("utf-8"),
                    "headers": headers,
                    "committed_at": datetime.now(UTC).isoformat(),
                }
            )
            stats_key = NO_KEY if key is None else key
            record = self.keys.get(stats_key)
            if record is None:
                record = self.keys[stats_key] = KeyRecord(digest=digest, processing=False)
            if record.first_id is None:
                record.first_id = delivery_id
                record.digest = digest
                record.reply = reply
            record.processing = False
            record.commits += 1
            return reply

    def lookup(self, key: str) -> Reply:
        """`GET /notifications/{key}`."""
        with self.lock:
            record = self.keys.get(key)
            if record is None:
                return json_reply(404, {"error": "not found"})
            if record.processing:
                return json_reply(409, {"status": "processing"})
            return json_reply(
                200,
                {
                    "id": record.first_id,
                    "idempotency_key": key,
                    "intent_digest": record.digest,
                    "status": "delivered",
                    "deliveries": record.commits,
                },
            )

    def stats(self) -> dict[str, Any]:
        with self.lock:
            keys = {
                key: {"commits": r.commits, "replays": r.replays, "refused": r.refused}
                for key, r in self.keys.items()
            }
            return {
                "keys": keys,
                "totals": {
                    "commits": len(self.deliveries),
                    "replays": sum(r.replays for r in self.keys.values()),
                    "refused": sum(r.refused for r in self.keys.values()),
                    "requests": self.requests,
                    "faulted": self.faulted,
                    "dropped": self.dropped,
                    "connections": self.connections,
                },
            }

    def snapshot_deliveries(self) -> list[dict[str, Any]]:
        with self.lock:
            return copy.deepcopy(self.deliveries)


# --- a stand-in for Claude's Messages API, for rehearsing `send --compose` offline ---------

MESSAGES_PATH: Final = "/v1/messages"
MODELS_PREFIX: Final = "/v1/models/"


def model_reply(model: str) -> Reply:
    """Every model exists here: the rehearsal is about the run, not the model's name."""
    return json_reply(
        200,
        {"type": "model", "id": model, "display_name": model, "created_at": "2025-01-01T00:00:00Z"},
    )


def draft_reply(request: Mapping[str, Any]) -> Reply:
    """A well-formed tool call that drafts the row from its own columns, deterministically, so
    a rehearsal shows what a composed run does (drafts stored, fingerprint, approval, sends)
    without a key that costs money or a network. It answers whatever tool the request forces."""
    messages = request.get("messages")
    row = ""
    if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping):
        content = messages[-1].get("content")
        row = content.partition("\n")[2] if isinstance(content, str) else ""
    choice = request.get("tool_choice")
    tool = choice.get("name") if isinstance(choice, Mapping) else None
    if not isinstance(tool, str):
        return error_reply(400, "the sandbox answers only requests that force one tool")
    return json_reply(
        200,
        {
            "id": "msg_sandbox", "type": "message", "role": "assistant",
            "model": str(request.get("model", "sandbox")),
            "content": [{"type": "tool_use", "id": "toolu_sandbox", "name": tool,
                         "input": {"subject": "Sandbox draft",
                                   "body": f"A sandbox draft for the row {row}"}}],
            "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    )  # fmt: skip
