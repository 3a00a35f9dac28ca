"""A group of writes that go to the database together, as the dialect allows: one statement
(data-modifying WITHs) where writes may stand in a WITH (PostgreSQL: each round trip to the
server is felt in a group commit), else one statement each (SQLite). The ledger builds a
group once; which form it takes is the dialect's `writing_ctes`, never a branch of its own.

NamedTuples, not frozen dataclasses: a group commit builds five of these, and a frozen
dataclass's __init__ (object.__setattr__ per field) is felt on the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .engine import Dialect


class Write(NamedTuple):
    """One data-modifying statement of a group. `{v}` in its text stands for the group's
    VALUES rows (see Group.values); `before` are its parameters written before `{v}`,
    `after` those after it."""

    sql: str
    before: Sequence[Any] = ()
    after: Sequence[Any] = ()


class Group(NamedTuple):
    """Writes in order, the one at `counted` being the conditional move whose rows say what
    the group did (as one statement, it returns `returning`: the seqs it moved)."""

    writes: Sequence[Write]
    counted: int
    returning: str = "seq"
    # The rows several writes read, `VALUES` text and its parameters ("" for none).
    values: str = ""
    values_params: Sequence[Any] = ()


class Moved(NamedTuple):
    """What the counted write moved: how many rows, and which seqs (in seq order) where the
    statement could say (None: one statement each, where only the count is known)."""

    rowcount: int
    seqs: list[int] | None


def run(conn: Any, dialect: Dialect, group: Group) -> Moved:
    """Send `group` as `dialect` allows: one statement whose every part sees one snapshot,
    or one statement each, in order."""
    if dialect.writing_ctes:
        return _as_one(conn, group)
    moved = 0
    source = f"(VALUES {group.values}) AS v"
    for i, write in enumerate(group.writes):
        sql, params = write.sql, write.before
        if "{v}" in sql:
            sql = sql.replace("{v}", source)
            params = [*params, *group.values_params, *write.after]
        elif write.after:
            params = [*params, *write.after]
        cursor = conn.execute(sql, params)
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
