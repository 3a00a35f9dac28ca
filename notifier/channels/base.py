"""The channel interface: a tiny surface in the spirit of an HTTP transport.

A channel sends one intent and returns a Receipt, or raises a ChannelError whose `kind` says
what is known about the outcome (retry.py decides what to do with it). A queryable channel
can also be asked, by idempotency key, whether it holds a delivery.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol

from notifier.domain.errors import BadInput, NotifierError
from notifier.domain.intent import Intent

# The longest wait a downstream can ask for. Any answer beyond it (Retry-After: 999999999999)
# is read as "a very long time": far past any --max-wait, so the run pauses, and small enough
# that a wall-clock time computed from it stays representable.
MAX_RETRY_AFTER_S = 366 * 24 * 3600.0


def bounded_wait(seconds: float | None) -> float | None:
    """A requested wait as a finite number of seconds in [0, MAX_RETRY_AFTER_S]."""
    if seconds is None:
        return None
    if math.isnan(seconds):
        return MAX_RETRY_AFTER_S
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class ErrorKind(StrEnum):
    """What an error says about the downstream effect (docs/design.md section 7)."""

    NOT_SENT = "not_sent"  # the request never left (refused, DNS): nothing happened
    THROTTLED = "throttled"  # 429/503: seen but not processed; slow the whole channel
    UNCERTAIN = "uncertain"  # timeout/reset after sending, 408, 500/502/504: maybe delivered
    # Delivered to some of a channel's destinations and not (or maybe not) to the others: never
    # sent again as a whole, and never marked not-sent (that would re-send to those that got it).
    PARTIAL = "partial"
    IN_PROGRESS = "in_progress"  # 409: the first request with this key is still running
    CONFLICT = "conflict"  # 422 / digest mismatch: another intent holds this key
    GONE = "gone"  # 410: the endpoint is gone for good
    PERMANENT = "permanent"  # any other 4xx: this request will never be accepted


@dataclass(frozen=True)
class Receipt:
    """Proof that the downstream holds a delivery under a key."""

    receipt_id: str | None
    intent_digest: str | None = None  # the digest the downstream stored, when it says
    replayed: bool = False  # the downstream answered from an earlier delivery


class ChannelError(NotifierError):
    """Internal to the send loop: what one attempt says about delivery (never shown raw)."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
        unreachable: bool = False,
        suppress_recipient: str | None = None,
        suppress_reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.http_status = http_status
        # A PERMANENT answer that rejects this one recipient for good (SMTP 550/551/553 with
        # a 5.1.x code at RCPT): the recipient, normalised as the intent's target is, and the
        # receiver's reply as the reason. Whoever keeps a suppression list reads these; the
        # item fails either way.
        self.suppress_recipient = suppress_recipient
        self.suppress_reason = suppress_reason
        # NOT_SENT because the receiver could not be reached at all (refused, DNS, TLS
        # handshake, a relay refusing the connection): the channel's failure, not the item's.
        self.unreachable = unreachable
        # Bounded here, where every channel's answer passes, so no absurd value reaches a
        # clock computation.
        self.retry_after = bounded_wait(retry_after)


# The sender's last check, which a channel asks once its connection is ready (greeting, EHLO,
# STARTTLS and login done, or a pooled connection handed out), right before the message is
# handed over: why the message must not go now (a window closed, a deadline or a halt came
# while the connection was being made), or None. The sender knows the rules; only the
# channel knows when its connection is ready, so the check travels with the send.
Ready = Callable[[], str | None]


def always() -> str | None:
    """A send with no last check (a direct call: tests, tools)."""
    return None


class Withheld(Exception):
    """The sender's last check said no: nothing of the message left (the connection, if one
    was made, carried no transaction). The item is released, never attempted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def go_ahead(ready: Ready) -> None:
    """Ask the sender's last check; raise Withheld when it says the message must not go."""
    reason = ready()
    if reason is not None:
        raise Withheld(reason)


class Capabilities(NamedTuple):
    """What a channel type promises, which decides what an uncertain answer means for an
    item. Each type states them once (its `capabilities` function, in the channel registry);
    its channel unpacks them into the attributes below."""

    idempotent: bool  # the downstream dedupes by key: re-sending with the same key is safe
    queryable: bool  # query(key) can prove whether a delivery exists
    thread_safe: bool  # send() may run on several threads at once (--concurrency)


class Channel(Protocol):
    name: str
    idempotent: bool  # see Capabilities
    queryable: bool
    thread_safe: bool

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        """Deliver `intent` under its idempotency key; raise ChannelError on failure. Ask
        `ready` (go_ahead) right before the message is handed over, after any connection
        step: Withheld when it says no, and then nothing of the message has left."""
        ...

    def query(self, key: str) -> Receipt | None:
        """The receipt the downstream holds under `key`, None when it provably holds
        nothing; raise ChannelError(UNCERTAIN) when it cannot tell."""
        ...

    def close(self) -> None: ...


class ChannelConfigError(BadInput):
    """A channel definition cannot be used as written; the message says how to fix it."""
