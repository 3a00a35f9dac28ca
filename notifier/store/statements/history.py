"""The statements of store/history.py (their notation: statements/__init__.py)."""

from __future__ import annotations

from notifier.store.prior import (
    ABANDONED,
    CHANGED,
    DELIVERED,
    OPEN,
    RETRIED,
    SAME_CONTENT,
    UNSETTLED,
)
from notifier.store.statements import abandoned

# Refused rows listed by name in a message; the rest are counted.
LISTED = 10


# An earlier item an operator abandoned: maybe delivered (statements.abandoned).
_ABANDONED = abandoned("p")


# A staged row without an id: its identity is a digest, never `id:…` (intent.row_identity).
# Not `identity = intent_digest`: a composed row (the freeze's stage, a run's own rows for
# `redraft`) keeps its source row's identity, while its intent digest is the drafted text's;
# its source content, the content a row with an id of the same file had, is its identity.
_NO_ID = "own.identity NOT LIKE 'id:%%'"


def _keyed(
    stage: str, *, by_content: bool, by_row_digest: bool = True, own_drafts: bool = False
) -> str:
    """The staged rows of `stage`, each under its own identity (`key`) and under the
    identities a row of the same content had where the file named its rows otherwise
    (intent.row_identity): for a row with an id, its intent digest (`key` = `intent_digest`:
    an id-less earlier row's identity; an `id:` identity never equals a digest, so this key
    finds only id-less earlier items, through items_identity as the first) and its row
    digest where that is not its intent digest (staged as `row_digest`: an id-less earlier
    row's identity whatever its deadline or line breaks); for a row without one, the
    identity of each earlier item with an id and the same channel and content, its row
    digest or its very intent (through items_content), its row digest as an item with an id
    kept it (through items_row_digest, m022: the same content with another deadline or line
    breaks), or composed from a row of that content (through drafts_by_content: a composed
    item has its drafted text's digest). Without `by_content` (a database from before m016
    or m018 read without migrating it) neither: with no index, every row would read every
    item of its channel; without `by_row_digest` (before m022) not the row digests items
    with ids kept. With `own_drafts` (the
    rows are run %(run_id)s's, composed: the freeze, `redraft`), a row with an id is keyed
    under the content it was drafted from too (its draft's source_digest): its intent
    digest is its drafted text's, and an id-less earlier row of its source content has that
    content as its identity. Only `key = identity` is the row's own."""
    by_row = (
        f"""
    UNION ALL
    SELECT DISTINCT own.seq, own.item_id, own.channel, own.intent_digest, own.identity,
        named.identity
    FROM {stage} AS own {{ordered_join}} items named {{indexed_items_row_digest}}
        ON named.channel = own.channel AND named.row_digest = own.identity
    WHERE {_NO_ID}"""
        if by_row_digest
        else ""
    )
    by_id = f"""
    UNION ALL
    SELECT DISTINCT own.seq, own.item_id, own.channel, own.intent_digest, own.identity,
        named.identity
    FROM {stage} AS own {{ordered_join}} items named {{indexed_items_content}}
        ON named.channel = own.channel
        AND named.intent_digest IN (own.identity, own.intent_digest)
        AND named.identity <> named.intent_digest
    WHERE {_NO_ID}{by_row}
    UNION ALL
    SELECT DISTINCT own.seq, own.item_id, own.channel, own.intent_digest, own.identity,
        drafted.identity
    FROM {stage} AS own {{ordered_join}} drafts d {{indexed_drafts_by_content}}
        ON d.source_digest = own.identity
    JOIN items drafted ON drafted.run_id = d.run_id AND drafted.seq = d.seq
        AND drafted.channel = own.channel AND drafted.identity LIKE 'id:%%'
    WHERE {_NO_ID}"""
    drafted = f"""
    UNION ALL
    SELECT own.seq, own.item_id, own.channel, own.intent_digest, own.identity, d.source_digest
    FROM {stage} AS own JOIN drafts d ON d.run_id = %(run_id)s AND d.seq = own.seq
    WHERE own.identity LIKE 'id:%%' AND d.source_digest IS NOT NULL"""
    tail = (by_id if by_content else "") + (drafted if own_drafts else "")
    # A row with an id under its row digest where that is not its intent digest (a deadline
    # or a `\r`: plan.make_plan stages it): an id-less earlier row of its content has that
    # identity whatever its deadline, so a file given an id column and another deadline is
    # compared with what it delivered, never sent again as new rows.
    return f"""(SELECT seq, item_id, channel, intent_digest, identity, identity AS key
    FROM {stage} AS own
    UNION ALL
    SELECT seq, item_id, channel, intent_digest, identity, intent_digest FROM {stage} AS own
    WHERE identity <> intent_digest
    UNION ALL
    SELECT seq, item_id, channel, intent_digest, identity, row_digest FROM {stage} AS own
    WHERE identity LIKE 'id:%%' AND row_digest IS NOT NULL{tail})"""


# The earlier item p was composed from a row of the staged row's content (m018).
_DRAFTED_FROM = (
    "EXISTS (SELECT 1 FROM drafts pd WHERE pd.run_id = p.run_id AND pd.seq = p.seq "
    "AND pd.source_digest = s.identity)"
)


# An item of the row's own identity (`s.key = s.identity`).
_MINE = "s.key = s.identity"


def _holds(*, by_content: bool, by_row_digest: bool = True) -> str:
    """Whether item p holds staged row s under key s.key (_keyed): always under the row's
    own identity and under its digest or drafted text's digest; a row without an id keyed
    under an id an earlier item of its content had, only through that id's items of its
    very content (or of its row digest, or drafted from it), open, unsettled, delivered or
    rejected."""
    drafted_from = f" OR {_DRAFTED_FROM}" if by_content else ""
    row_digest = " OR p.row_digest = s.identity" if by_content and by_row_digest else ""
    return (
        f"(s.identity LIKE 'id:%%' OR {_MINE} OR s.key = s.intent_digest "
        f"OR p.intent_digest IN (s.identity, s.intent_digest){row_digest}{drafted_from})"
    )


def _same_row(*, by_content: bool, s: str = "s") -> str:
    """Whether item p, of staged row s's own identity, is the row s is in what it says: the
    same intent, or, for a row without an id, any item of its row digest not composed (its
    identity: only its deadline or its line breaks differ, intent.row_digest). A composed
    item of that identity says its drafted text, which another row's content is not."""
    if not by_content:
        return f"p.intent_digest = {s}.intent_digest"
    return (
        f"(p.intent_digest = {s}.intent_digest OR ({s}.identity NOT LIKE 'id:%%' AND NOT EXISTS "
        "(SELECT 1 FROM drafts pd WHERE pd.run_id = p.run_id AND pd.seq = p.seq)))"
    )


def _per_row(
    stage: str, *, other_runs: bool = False, by_content: bool = True, by_row_digest: bool = True
) -> str:
    """Per staged row (s), the newest earlier run (by runs.rowid) in which each verdict's
    condition holds, NULL where it holds in none. Each column is non-NULL exactly when its
    verdict applies, so the first non-NULL one, in history.py's order, is the row's verdict.
    With `other_runs`, the rows are run %(run_id)s's own, and only other runs count.

    `open` and `unsettled` hold under either key: two runs never hold one notification open,
    however a file names its rows. The others are by the row's own identity (`mine`), but
    `same_content`: a row with no history of its own whose channel, recipient and content
    an earlier row named otherwise had (an id-less one for a row with an id, one with an id
    for a row without), delivered or abandoned (maybe delivered): the file names its rows
    otherwise than before, so whether they are the same notifications is not the tool's to
    guess (a re-export with an id column added or dropped, sent again: every row would go
    out twice; two rows with ids and one content: which one was sent?). For a row without
    an id, only the earlier items with its very content count (its identity: a composed
    row's intent digest is its drafted text's): another item of the same id may have had
    other content (for a row with one, or under its drafted text's digest, the key is that
    content)."""
    own = " AND p.run_id <> %(run_id)s" if other_runs else ""
    its_content = _holds(by_content=by_content, by_row_digest=by_row_digest)
    same_row = _same_row(by_content=by_content)
    return f"""
SELECT s.seq AS seq, s.item_id AS item_id,
    MAX(CASE WHEN p.state IN ('pending', 'in_flight', 'unknown')
        AND r.state NOT IN ('completed', 'cancelled') AND {its_content}
        THEN r.rowid END) AS open_in,
    MAX(CASE WHEN p.state IN ('in_flight', 'unknown') AND {its_content}
        THEN r.rowid END) AS unsettled_in,
    MAX(CASE WHEN {_MINE} AND p.state = 'sent' AND {same_row}
        THEN r.rowid END) AS delivered_in,
    MAX(CASE WHEN {_MINE} AND {_ABANDONED} AND {same_row}
        THEN r.rowid END) AS abandoned_in,
    MAX(CASE WHEN {_MINE} AND (p.state = 'sent' OR {_ABANDONED}) THEN r.rowid END)
        AS changed_in,
    MAX(CASE WHEN NOT {_MINE} AND (p.state = 'sent' OR {_ABANDONED}) AND {its_content}
        THEN r.rowid END) AS same_content_in,
    MAX(CASE WHEN {_MINE} THEN r.rowid END) AS earlier
FROM {_keyed(stage, by_content=by_content, by_row_digest=by_row_digest, own_drafts=other_runs)}
    AS s {{ordered_join}} items p
    ON p.channel = s.channel AND p.identity = s.key{own}
JOIN runs r ON r.run_id = p.run_id
GROUP BY s.seq, s.item_id
"""


_VERDICT = f"""CASE WHEN open_in IS NOT NULL THEN '{OPEN}'
    WHEN unsettled_in IS NOT NULL THEN '{UNSETTLED}'
    WHEN delivered_in IS NOT NULL THEN '{DELIVERED}'
    WHEN abandoned_in IS NOT NULL THEN '{ABANDONED}'
    WHEN changed_in IS NOT NULL THEN '{CHANGED}'
    WHEN same_content_in IS NOT NULL THEN '{SAME_CONTENT}' ELSE '{RETRIED}' END"""


def verdicts_by_run(stage: str, *, by_content: bool = True, by_row_digest: bool = True) -> str:
    """How many staged rows of `stage` get each verdict, by the earlier run it names."""
    return f"""
SELECT v.verdict, r.run_id, COUNT(*) FROM (
    SELECT {_VERDICT} AS verdict,
        COALESCE(open_in, unsettled_in, delivered_in, abandoned_in, changed_in,
            same_content_in, earlier) AS run_rowid
    FROM ({_per_row(stage, by_content=by_content, by_row_digest=by_row_digest)}) AS m
) AS v JOIN runs r ON r.rowid = v.run_rowid
GROUP BY v.verdict, r.run_id
ORDER BY v.verdict, MIN(r.rowid)
"""


def held_by_run(stage: str, verdicts: tuple[str, ...], *, other_runs: bool = False) -> str:
    """(seq, item_id, run_id) of the staged rows of `stage` whose verdict is one of
    `verdicts`, with the run it names (`other_runs`: see _per_row)."""
    listed = ", ".join(f"'{v}'" for v in verdicts)
    return f"""
SELECT m.seq, m.item_id, r.run_id FROM ({_per_row(stage, other_runs=other_runs)}) AS m
JOIN runs r ON r.rowid = COALESCE(m.open_in, m.unsettled_in, m.delivered_in, m.abandoned_in,
    m.changed_in, m.same_content_in, m.earlier)
WHERE {_VERDICT} IN ({listed})
ORDER BY m.seq
"""


def rows_of_run(n: int) -> str:
    """Run %(run_id)s's items %(seq0)s… (`n` of them) as a stage is read: their row identity."""
    seqs = ", ".join(f"%(seq{i})s" for i in range(n))
    return (
        "(SELECT seq, item_id, channel, identity, intent_digest, row_digest FROM items "
        f"WHERE run_id = %(run_id)s AND seq IN ({seqs}))"
    )


def changed_rows(stage: str, *, by_content: bool = True, by_row_digest: bool = True) -> str:
    """The first LISTED staged rows of `stage` whose verdict is `changed`."""
    rows = _per_row(stage, by_content=by_content, by_row_digest=by_row_digest)
    return f"""
SELECT seq, item_id FROM ({rows}) AS m
WHERE {_VERDICT} = '{CHANGED}' ORDER BY seq LIMIT {LISTED}
"""


# Runs a reviewer rejected: cancelled from awaiting approval, with a `rejected` event.
REJECTED_RUNS = (
    "SELECT r.run_id FROM runs r WHERE r.state = 'cancelled' AND EXISTS (SELECT 1 FROM "
    "events e WHERE e.run_id = r.run_id AND e.kind = 'rejected') ORDER BY r.rowid"
)


def held_by(stage: str) -> str:
    """How many staged rows of `stage` the run `run_id` held: under any key a row has
    (_keyed), as another run holds it (_holds): the same identity, or the content of a row
    it held named otherwise. A rejection holds by content too."""
    return f"""
SELECT COUNT(DISTINCT s.seq) FROM {_keyed(stage, by_content=True)} AS s {{ordered_join}} items p
    ON p.channel = s.channel AND p.identity = s.key AND p.run_id = %(run_id)s
WHERE {_holds(by_content=True)}
"""


def drop_delivered(stage: str) -> str:
    """Staged rows already delivered, or abandoned, as the same row (_same_row: the
    verdicts `delivered` and `abandoned`): taken out of the stage, so what is copied into the
    run is exactly what is left to send."""
    return f"""
DELETE FROM {stage} WHERE EXISTS (SELECT 1 FROM items p
    WHERE p.channel = {stage}.channel AND p.identity = {stage}.identity
    AND (p.state = 'sent' OR {_ABANDONED}) AND {_same_row(by_content=True, s=stage)})
"""
