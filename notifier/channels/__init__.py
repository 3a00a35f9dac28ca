"""Channels: where notifications go. `build_channel` makes one from its definition."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from notifier.channels.base import (
    Capabilities,
    Channel,
    ChannelConfigError,
    Ready,
    Withheld,
    always,
    go_ahead,
)
from notifier.channels.options import nearest
from notifier.channels.registry import TYPES
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent

__all__ = [
    "Capabilities",
    "Channel",
    "ChannelConfigError",
    "ChannelError",
    "ErrorKind",
    "Ready",
    "Receipt",
    "UnbuildableChannel",
    "Withheld",
    "always",
    "build_channel",
    "capabilities",
    "definition_problems",
    "go_ahead",
    "target_problem",
]


def definition_problems(where: str, definition: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a channel definition, checked against its type's schema."""
    kind = definition.get("type")
    if not isinstance(kind, str) or kind not in TYPES:
        hint = nearest(kind, TYPES) if isinstance(kind, str) else ""
        return [f"{where}: type {kind!r}{hint} is not one of {', '.join(sorted(TYPES))}"]
    return TYPES[kind].schema.problems(where, definition)


def capabilities(definition: Mapping[str, Any]) -> Capabilities:
    """What a channel built from `definition` (already checked) will promise."""
    return TYPES[definition["type"]].capabilities(definition)


def target_problem(kind: str, target: str, channel: str) -> str | None:
    """Why a batch row's `to` cannot go through `channel`, of type `kind`; None when it can."""
    entry = TYPES.get(kind)
    return None if entry is None else entry.target_problem(target, channel)


class UnbuildableChannel:
    """Stands in for a channel whose definition cannot be built any more, so that a run can
    still be cancelled: nothing can be sent through it or asked of it."""

    idempotent = False
    queryable = False
    thread_safe = True
    timeout_s = 0.0  # nothing goes through it
    query_delay_s = 0.0
    suppress_on_reject = False
    max_in_flight: int | None = None

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        raise ChannelError(ErrorKind.NOT_SENT, f"channel {self.name!r} unusable: {self.problem}")

    def query(self, key: str) -> Receipt | None:
        raise ChannelError(ErrorKind.UNCERTAIN, f"channel {self.name!r} unusable: {self.problem}")

    def close(self) -> None:
        pass


def build_channel(name: str, definition: dict[str, Any], base_dir: Path) -> Channel:
    """Instantiate the channel `name` from its (snapshotted) definition."""
    kind = definition.get("type")
    if not isinstance(kind, str) or kind not in TYPES:
        raise ChannelConfigError(f"channel {name!r}: unknown type {kind!r}")
    return TYPES[kind].build(name, definition, base_dir)
