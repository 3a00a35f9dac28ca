"""Timestamps as fixed-width ISO-8601 UTC text, so that SQL string comparison orders them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def now_iso() -> str:
    return iso(now())


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


def later(seconds: float, start: datetime | None = None) -> datetime:
    return (start or now()) + timedelta(seconds=seconds)


def local(text: str | None) -> str:
    """A stored timestamp as the operator's local wall-clock time, for messages."""
    if not text:
        return "-"
    return parse(text).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def seconds_until(moment: datetime) -> float:
    """Seconds from now (wall clock) to `moment`; 0 when it has passed."""
    return max(0.0, (moment - now()).total_seconds())
