"""What a downstream's answer can say about one send: a receipt, or an error whose kind
says what is known about delivery. The vocabulary every layer shares (channels produce it,
the one decision reads it); no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from notifier.domain.errors import NotifierError

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
