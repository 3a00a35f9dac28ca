"""A group of writes that go to the database together, as the dialect allows: one statement
(data-modifying WITHs) where writes may stand in a WITH (PostgreSQL: each round trip to the
server is felt in a group commit), else one statement each (SQLite). The ledger builds a
group once; which form it takes is the dialect's `writing_ctes`, never a branch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine import Dialect


@dataclass(frozen=True)
class Write:
    """One data-modifying statement of a group. `{v}` in its text stands for the group's
    VALUES rows (see Group.values); `before` are its parameters written before `{v}`,
    `after` those after it."""

    sql: str
    before: Sequence[Any] = ()
    after: Sequence[Any] = ()


@dataclass(frozen=True)
class Group:
    """Writes in order, the one at `counted` being the conditional move whose rows say what
    the group did (as one statement, it returns `returning`: the seqs it moved)."""

    writes: Sequence[Write]
    counted: int
    returning: str = "seq"
    # The rows several writes read, `VALUES` text and its parameters ("" for none).
    values: str = ""
    values_params: Sequence[Any] = field(default_factory=tuple)


@dataclass(frozen=True)
class Moved:
    """What the counted write moved: how many rows, and which seqs (in seq order) where the
    statement could say (None: one statement each, where only the count is known)."""

    count: int
    seqs: list[int] | None


def run(conn: Any, dialect: Dialect, group: Group) -> Moved:
    """Send `group` as `dialect` allows: one statement whose every part sees one snapshot,
    or one statement each, in order."""
    if dialect.writing_ctes:
        return _as_one(conn, group)
    moved = 0
    source = f"(VALUES {group.values}) AS v" if group.values else ""
    for i, write in enumerate(group.writes):
        params = [*write.before, *(group.values_params if "{v}" in write.sql else ()),
                  *write.after]  # fmt: skip
        cursor = conn.execute(write.sql.replace("{v}", source), params)
        if i == group.counted:
            moved = cursor.rowcount
    return Moved(moved, None)


def _as_one(conn: Any, group: Group) -> Moved:
    parts = [f"v AS (VALUES {group.values})"] if group.values else []
    params: list[Any] = list(group.values_params)
    for i, write in enumerate(group.writes):
        sql = write.sql.replace("{v}", "v")
        if i == group.counted:
            parts.append(f"moved AS ({sql} RETURNING {group.returning})")
        else:
            parts.append(f"w{i} AS ({sql})")
        params += [*write.before, *write.after]
    seqs = [
        seq
        for (seq,) in conn.execute(
            f"WITH {', '.join(parts)} SELECT seq FROM moved ORDER BY seq", params
        ).fetchall()
    ]
    return Moved(len(seqs), seqs)
