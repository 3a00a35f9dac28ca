"""A group of writes that go to the database together, as the dialect allows: one statement
(data-modifying WITHs) where writes may stand in a WITH (PostgreSQL: each round trip to the
server is felt in a group commit), else one statement each (SQLite). The ledger builds a
group once; which form it takes is the dialect's `writing_ctes`, never a branch of its own.

NamedTuples, not frozen dataclasses: a group commit builds two of these, and a frozen
dataclass's __init__ (object.__setattr__ per field) is felt on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from notifier.store.backend import Engine
from notifier.store.statements import writes as sql


class Group(NamedTuple):
    """Writes in order (statements of statements/, `{v}` in one standing for the group's
    VALUES rows), the one at `counted` being the conditional move whose rows say what the
    group did (as one statement, it returns `returning`: the seqs it moved). One mapping
    binds the parameters of them all."""

    writes: tuple[str, ...]
    counted: int
    returning: str = "seq"
    # The rows several writes read, `VALUES` text ("" for none).
    values: str = ""


class Moved(NamedTuple):
    """What the counted write moved: how many rows, and which seqs (in seq order) where the
    statement could say (None: one statement each, where only the count is known)."""

    rowcount: int
    seqs: list[int] | None


def run(engine: Engine, group: Group, params: Mapping[str, Any]) -> Moved:
    """Send `group` as the engine's dialect allows: one statement whose every part sees one
    snapshot, or one statement each, in order."""
    if engine.dialect.writing_ctes:
        statement = sql.as_one(group.writes, group.counted, group.returning, group.values)
        seqs = [seq for (seq,) in engine.execute(statement, params).fetchall()]
        return Moved(len(seqs), seqs)
    moved = 0
    for i, statement in enumerate(sql.separately(group.writes, group.values)):
        cursor = engine.execute(statement, params)
        if i == group.counted:
            moved = cursor.rowcount
    return Moved(moved, None)
