"""Every statement the store's parts send, by name, written once for both engines: one
module here per part of the store (statements.ledger for ledger.py, …), the notation, the
compiling and what many share in this one.

Notation. Parameters are written as psycopg writes them, `%(name)s` (a literal `%` is
`%%`); the dialect's fragments (engine.Dialect, and the engine's index hints) as
`{row_lock}`, `{claim_lock}`, `{share_lock}`, `{reap_lock}`, `{ordered_join}`, `{now_s}`, `{least}`,
`{indexed_items_attention}`…: `fragments` lists them all. Each engine compiles a statement
the first time it sends it, into its driver's own form: SQLite's `?n`, PostgreSQL's `$n`
(psycopg's RawCursor), bound from the names in that order. Python's own str.format and
%-formatting do that: nothing parses SQL.

A statement whose shape varies (n values in a list, the columns a move sets) is a function
returning the statement for that shape. The engines' own statements (pragmas, COPY,
numbering events) stay in sqlite.py and postgres.py: they exist on one engine only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from notifier.domain.records import MAYBE_DELIVERED_OUTCOMES
from notifier.domain.state_machine import ACTIVE_ITEM_STATES, ItemState, ItemTrigger

if TYPE_CHECKING:
    from notifier.store.backend import Dialect

# The partial indexes an SQLite read may name with INDEXED BY (engine.indexed): a fragment
# `{indexed_NAME}` each.
HINTED_INDEXES = (
    "items_attention",
    "items_retried",
    "items_pending_channel",
    "events_disproof",
    "items_content",
    "drafts_by_content",
    "items_row_digest",
)


def fragments(dialect: Dialect, indexed: dict[str, str]) -> dict[str, str]:
    """The `{name}` fragments of an engine: its dialect's SQL pieces and index hints."""
    return {
        "ordered_join": dialect.ordered_join,
        "claim_lock": dialect.claim_lock,
        "row_lock": dialect.row_lock,
        "share_lock": dialect.share_lock,
        "reap_lock": dialect.reap_lock,
        "now_s": dialect.now_s,
        "least": dialect.least,
        **{f"indexed_{index}": hint for index, hint in indexed.items()},
    }


class _Numbered(dict[str, str]):
    """`%(name)s` as the driver's numbered parameter (`mark` and n: SQLite's `?n`,
    PostgreSQL's `$n`), numbered in order of first appearance (a name used twice is one
    parameter); the dict's order is then the parameters' order."""

    def __init__(self, mark: str) -> None:
        super().__init__()
        self._mark = mark

    def __missing__(self, name: str) -> str:
        self[name] = f"{self._mark}{len(self) + 1}"
        return self[name]


def _numbered(statement: str, fragments: dict[str, str], mark: str) -> tuple[str, tuple[str, ...]]:
    numbered = _Numbered(mark)
    text = statement.format_map(fragments) % numbered
    return text, tuple(numbered)


def for_sqlite(statement: str, fragments: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The statement with `?n` parameters, and the names to bind in `?n` order. Not
    sqlite3's `:name`: SQLite finds a parameter's name by walking the statement's list of
    them, so binding n named parameters costs in n squared (a group commit's statement of 64
    answers binds 640 of them, at several times the cost of the same values in order)."""
    return _numbered(statement, fragments, "?")


def for_postgres(statement: str, fragments: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The statement with `$n` parameters, and the names to bind in `$n` order."""
    return _numbered(statement, fragments, "$")


# How many compiled statements an engine keeps, and how many texts each shape function keeps:
# the store sends about a hundred fixed statements, and shapes of n values (a claim leaving
# out n held items, n acks in a group) whose n is not bounded by anything but the run. As
# sqlite3's own statement cache does, the least recently sent go first.
KEPT = 256
_T = TypeVar("_T")


class Compiled(OrderedDict[str, _T]):
    """An engine's compiled statements (`compile` of the statement's text), the KEPT most
    recently sent."""

    def __init__(self, compile: Callable[[str], _T]) -> None:
        super().__init__()
        self._compile = compile

    def of(self, statement: str) -> _T:
        compiled = self.get(statement)
        if compiled is None:
            compiled = self[statement] = self._compile(statement)
            if len(self) > KEPT:
                self.popitem(last=False)
        else:
            self.move_to_end(statement)
        return compiled


# ---------------------------------------------------------------- conditions many share

ACTIVE = "state IN ({})".format(", ".join(f"'{s.value}'" for s in ACTIVE_ITEM_STATES))
# The states someone has to look at; repeating m004's partial index condition word for word
# lets SQLite use items_attention (it matches a partial index only on the very same terms).
ATTENTION_STATES = (ItemState.IN_FLIGHT, ItemState.UNKNOWN, ItemState.FAILED)
ATTENTION = "state IN ({})".format(", ".join(f"'{s.value}'" for s in ATTENTION_STATES))
# Whether the attempt `a` was disproved: a later query (`not_found`) or operator
# (`mark_not_sent`) proved its item undelivered (records.Attempt.disproved).
# "Later" twice over. After `a` finished, on the clocks (the disproof's own window is judged
# from then). And after `a` started in the run's own order of events: at least `a.n` of the
# item's claims (each opens one attempt) come before the disproof. Clocks alone are not
# enough: a mark made on an operator's clock minutes ahead of the worker's (another host, an
# NTP step) would read as later than the attempts `resume` makes after it, and call a
# request the receiver committed never delivered.
# Named on SQLite: without statistics it prefers m014's events_by_item, which holds every
# event of the item, to m004's events_disproof, which holds only the disproving ones
# (bench/disproof.py: 0.145 s against 0.328 s for 100,000 retried items).
DISPROVED = (
    "EXISTS (SELECT 1 FROM events e {indexed_events_disproof} WHERE e.run_id = a.run_id "
    f"AND e.item_seq = a.seq AND e.kind IN ('{ItemTrigger.NOT_FOUND.value}', "
    f"'{ItemTrigger.MARK_NOT_SENT.value}') AND e.at >= a.finished_at "
    "AND (SELECT COUNT(*) FROM events s WHERE s.run_id = a.run_id AND s.item_seq = a.seq "
    f"AND s.kind = '{ItemTrigger.START.value}' AND s.seq_no < e.seq_no) >= a.n)"
)
# Whether an item `i` may have reached its recipient: records.maybe_delivered, in SQL. One of
# its attempts had an outcome that proves nothing (records.MAYBE_DELIVERED_OUTCOMES, written
# out from that set) and was not disproved. Any such attempt counts, not only the last: a
# 429 or a release after a 500 says nothing about the 500's request. Such an item is never
# called never sent (expired).
_MAYBE_DELIVERED_OUTCOMES = ", ".join(
    f"'{outcome.value}'" for outcome in sorted(MAYBE_DELIVERED_OUTCOMES)
)
MAYBE_DELIVERED = (
    "EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = i.run_id AND a.seq = i.seq AND "
    f"a.outcome IN ({_MAYBE_DELIVERED_OUTCOMES}) AND NOT {DISPROVED})"
)


def abandoned(item: str) -> str:
    """Whether the item aliased `item` was abandoned by an operator (`reconcile --manual
    --mark abandon`): failed, its newest decision `abandon`. Its outcome is unknown, so its
    row is maybe delivered and never planned again by a plain send (store/history.py). A
    later `--mark not-sent` (a newer decision; Ledger.release_abandoned) leaves it failed but
    no longer abandoned: known never delivered, its row is planned again."""
    return (
        f"({item}.state = 'failed' AND EXISTS (SELECT 1 FROM decisions d "
        f"WHERE d.run_id = {item}.run_id AND d.seq = {item}.seq AND d.decision = 'abandon' "
        "AND NOT EXISTS (SELECT 1 FROM decisions n WHERE n.run_id = d.run_id "
        "AND n.seq = d.seq AND n.id > d.id)))"
    )


# Whether one item is abandoned (read by the ledger's decision and by `reconcile --manual`).
ITEM_ABANDONED = (
    f"SELECT {abandoned('i')} FROM items i WHERE i.run_id = %(run_id)s AND i.seq = %(seq)s"
)


def state_literal(state: ItemState) -> str:
    """An item state as an SQL literal, for the condition of a conditional move. Bound as a
    parameter, it made SQLite prepare the statement again on every execution (it weighs a
    bound value against the partial indexes' `state` conditions, so binding it again expires
    the plan): measured, a third of the committer's SQL work was parsing."""
    return f"'{ItemState(state).value}'"


def listed(name: str, n: int) -> str:
    """`%(name0)s, %(name1)s, …`: the n parameters of an IN list (bound by `bound`)."""
    return ", ".join(f"%({name}{k})s" for k in range(n))


def bound(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The values of an IN list written by `listed`, by name."""
    return {f"{name}{k}": value for k, value in enumerate(values)}


def padded(n: int) -> int:
    """How many rows a group commit's statement of n rows is written for: the next power of
    two up to 8, then the next multiple of 8. A text per n would make nearly every group
    commit's statements new texts, each parsed again (sqlite3 keeps 128 prepared statements;
    psycopg prepares a text, with its parameters' types, once it has seen it five times): up
    to 64 sizes (the command line's largest window) of five kinds of write. Padded, there are
    eleven sizes. Not to the next power of two: each padding row binds a parameter per field
    in every write of the group, and binding is most of what such a statement costs SQLite
    (a commit of 33 answers written for 64 cost twice what 40 does). The rows past n are
    NULLs, which no join, `IN` or `IS NOT NULL` filter lets through. Never pad a `NOT IN`
    list: a NULL in it lets no row through at all."""
    if n <= 8:
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // 8) * 8


def padding(fields: Sequence[str], n: int) -> dict[str, None]:
    """The NULLs that bind rows n… of a statement written for `padded(n)` rows, whose row i
    reads the parameters `field{i}` of each of `fields`."""
    return {f"{field}{i}": None for i in range(n, padded(n)) for field in fields}


# The claim's extra condition: the item's start time, if any, has come by `%(at)s`.
DUE = "(not_before IS NULL OR not_before <= %(at)s)"


LAST_EVENT = "SELECT MAX(seq_no) FROM events WHERE run_id = %(run_id)s"
