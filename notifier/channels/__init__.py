"""Channels: where notifications go. `build_channel` makes one from its definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .apprise import AppriseChannel
from .base import Channel, ChannelConfigError, ChannelError, ErrorKind, Receipt
from .outbox import OutboxChannel
from .smtp import SmtpChannel
from .webhook import WebhookChannel

__all__ = [
    "Channel",
    "ChannelConfigError",
    "ChannelError",
    "ErrorKind",
    "Receipt",
    "build_channel",
]


def build_channel(name: str, definition: dict[str, Any], base_dir: Path) -> Channel:
    """Instantiate the channel `name` from its (snapshotted) definition."""
    kind = definition.get("type")
    if kind == "outbox":
        return OutboxChannel(name, base_dir / str(definition.get("dir") or "outbox"))
    if kind == "webhook":
        return WebhookChannel(name, definition)
    if kind == "smtp":
        return SmtpChannel(name, definition)
    if kind == "apprise":
        return AppriseChannel(name, definition)  # imports the optional `apprise` lazily
    raise ChannelConfigError(f"channel {name!r}: unknown type {kind!r}")
