"""The channel types: the one place that lists them. Per type, its options schema (checked
whenever notifier.toml loads), its capabilities (from a definition, without building the
channel), what it needs of a batch row's target, and how to build one.

The webhook's and smtp's channels are imported by their builders only: every command checks
notifier.toml against the schemas, and loading httpx2 or smtplib for that would cost every
start-up; their schemas and capabilities sit in light `*_options` modules for that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notifier.channels import apprise, outbox, smtp_options, webhook_options
from notifier.channels.base import Capabilities, Channel
from notifier.channels.options import Schema


@dataclass(frozen=True)
class ChannelType:
    schema: Schema
    capabilities: Callable[[Mapping[str, Any]], Capabilities]
    # (name, definition already checked against `schema`, the workspace) -> a channel
    build: Callable[[str, dict[str, Any], Path], Channel]
    # (a batch row's `to`, the channel's name) -> why planning refuses the row, or None
    target_problem: Callable[[str, str], str | None] = lambda target, channel: None


def _webhook(name: str, definition: dict[str, Any], base_dir: Path) -> Channel:
    from notifier.channels.webhook import WebhookChannel  # noqa: PLC0415 (httpx2: see the module docstring)

    return WebhookChannel(name, definition)


def _smtp(name: str, definition: dict[str, Any], base_dir: Path) -> Channel:
    from notifier.channels.smtp import SmtpChannel  # noqa: PLC0415 (smtplib: see the module docstring)

    return SmtpChannel(name, definition)


def _apprise(name: str, definition: dict[str, Any], base_dir: Path) -> Channel:
    return apprise.AppriseChannel(name, definition)  # imports the optional extra lazily


TYPES: Mapping[str, ChannelType] = {
    "outbox": ChannelType(outbox.SCHEMA, outbox.capabilities, outbox.build),
    "webhook": ChannelType(webhook_options.SCHEMA, webhook_options.capabilities, _webhook),
    "smtp": ChannelType(
        smtp_options.SCHEMA, smtp_options.capabilities, _smtp, smtp_options.target_problem
    ),
    "apprise": ChannelType(apprise.SCHEMA, apprise.capabilities, _apprise, apprise.target_problem),
}
