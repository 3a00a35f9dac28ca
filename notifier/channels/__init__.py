"""Channels: where notifications go. `build_channel` makes one from its definition."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..intent import Intent
from . import apprise, outbox, smtp_options, webhook_options
from .apprise import AppriseChannel
from .base import Channel, ChannelConfigError, ChannelError, ErrorKind, Receipt
from .options import Schema, nearest
from .outbox import OutboxChannel

# The channel registry: each type's one option table lives in its own module. Every command
# checks notifier.toml against them, so the webhook's and smtp's sit apart from their
# channels, which load httpx2 or smtplib only when a run builds one (start-up time).
SCHEMAS: dict[str, Schema] = {
    "outbox": outbox.SCHEMA,
    "webhook": webhook_options.SCHEMA,
    "smtp": smtp_options.SCHEMA,
    "apprise": apprise.SCHEMA,
}

__all__ = [
    "Channel",
    "ChannelConfigError",
    "ChannelError",
    "ErrorKind",
    "Receipt",
    "UnbuildableChannel",
    "build_channel",
    "definition_problems",
]


def definition_problems(where: str, definition: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a channel definition, checked against its type's schema."""
    kind = definition.get("type")
    if not isinstance(kind, str) or kind not in SCHEMAS:
        hint = nearest(kind, SCHEMAS) if isinstance(kind, str) else ""
        return [f"{where}: type {kind!r}{hint} is not one of {', '.join(sorted(SCHEMAS))}"]
    return SCHEMAS[kind].problems(where, definition)


class UnbuildableChannel:
    """Stands in for a channel whose definition cannot be built any more, so that a run can
    still be cancelled: nothing can be sent through it or asked of it."""

    idempotent = False
    queryable = False
    thread_safe = True

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem

    def send(self, intent: Intent) -> Receipt:
        raise ChannelError(ErrorKind.NOT_SENT, f"channel {self.name!r} unusable: {self.problem}")

    def query(self, key: str) -> Receipt | None:
        raise ChannelError(ErrorKind.UNCERTAIN, f"channel {self.name!r} unusable: {self.problem}")

    def close(self) -> None:
        pass


def build_channel(name: str, definition: dict[str, Any], base_dir: Path) -> Channel:
    """Instantiate the channel `name` from its (snapshotted) definition."""
    kind = definition.get("type")
    if kind == "outbox":
        return OutboxChannel(name, base_dir / str(definition.get("dir") or "outbox"))
    if kind == "webhook":
        from .webhook import WebhookChannel  # noqa: PLC0415 (httpx2: see SCHEMAS)

        return WebhookChannel(name, definition)
    if kind == "smtp":
        from .smtp import SmtpChannel  # noqa: PLC0415 (smtplib: see SCHEMAS)

        return SmtpChannel(name, definition)
    if kind == "apprise":
        return AppriseChannel(name, definition)  # imports the optional `apprise` lazily
    raise ChannelConfigError(f"channel {name!r}: unknown type {kind!r}")
