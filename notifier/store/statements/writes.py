"""The statements of store/writes.py (their notation: statements/__init__.py)."""

from __future__ import annotations

import functools

# A group's writes (writes.py) read its VALUES rows as `{v}`, put in here before an engine
# sees the statement. Cached: a group commit sends the same few shapes over and over.
from notifier.store.statements import KEPT


@functools.lru_cache(maxsize=KEPT)
def separately(writes: tuple[str, ...], values: str) -> tuple[str, ...]:
    """The group's writes as one statement each, `{v}` the VALUES rows themselves."""
    source = f"(VALUES {values}) AS v"
    return tuple(write.replace("{v}", source) for write in writes)


@functools.lru_cache(maxsize=KEPT)
def as_one(writes: tuple[str, ...], counted: int, returning: str, values: str) -> str:
    """The group's writes as one statement of data-modifying WITHs, `{v}` the WITH naming
    the VALUES rows; it returns `returning` of the rows the write at `counted` moved."""
    parts = [f"v AS (VALUES {values})"] if values else []
    for i, write in enumerate(writes):
        text = write.replace("{v}", "v")
        if i == counted:
            parts.append(f"moved AS ({text} RETURNING {returning})")
        else:
            parts.append(f"w{i} AS ({text})")
    return f"WITH {', '.join(parts)} SELECT seq FROM moved ORDER BY seq"
