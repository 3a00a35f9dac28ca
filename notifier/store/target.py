"""Which engine a --db target names, without importing either driver."""

from __future__ import annotations

from pathlib import Path

SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str | Path) -> bool:
    """A postgresql:// URL (a PostgreSQL store); anything else is an SQLite file."""
    return isinstance(target, str) and target.startswith(SCHEMES)
