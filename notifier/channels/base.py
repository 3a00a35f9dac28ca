"""The channel interface: a tiny surface in the spirit of an HTTP transport.

A channel sends one intent and returns a Receipt, or raises a ChannelError whose `kind` says
what is known about the outcome (retry.py decides what to do with it). A queryable channel
can also be asked, by idempotency key, whether it holds a delivery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from notifier.domain.answers import Receipt
from notifier.domain.errors import BadInput
from notifier.domain.intent import Intent

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
    # The receiver's window (evidence.Capable): how long after a request left the receiver
    # may still commit it, and how much longer its status query may not show it; 0 for none.
    timeout_s: float
    query_delay_s: float
    # Whether a permanent rejection of a recipient puts it on the suppression list (SMTP's
    # option); the most requests in flight at once, None: as many as the run's senders.
    suppress_on_reject: bool
    max_in_flight: int | None

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
