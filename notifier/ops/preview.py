"""`notifier preview`: every notification of a run as it will be sent, for a reviewer to read
before approving it (docs/design.md sections 10 and 11), and the fingerprint of exactly what was
shown.

The notifications are read from the store one at a time and written out as they are read (a
run may hold a million): nothing but the running hash and, for the table, its first rows is
kept. Each digest is recomputed from the item as stored, and the fingerprint is hashed from
those digests, so the fingerprint printed at the end covers the very rows that were written;
if it no longer matches the one computed when the run was planned, the intents were changed
after planning and no fingerprint is printed at all (an approval of it would be refused).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

from notifier.domain.cells import safe_cell
from notifier.domain.errors import NextStep
from notifier.domain.intent import canonical_json, intent_digest
from notifier.domain.records import Run
from notifier.ops.approval import ApprovalUsage, NotApproved, Unapproved
from notifier.store import Store

FORMATS = ("table", "json", "jsonl", "csv")
FIELDS = ("seq", "id", "to", "channel", "subject", "body", "deadline", "digest", "data")
TABLE_ROWS = 10  # the table shows the first rows; jsonl and csv show every one
_CHUNK = 1000  # rows per piece written


class Review:
    """The notifications of `run`, read once in seq order by iterating; afterwards
    `fingerprint()` is the fingerprint of what was read."""

    def __init__(self, store: Store, run: Run) -> None:
        if run.fingerprint == "":
            raise ApprovalUsage(
                f"run {run.run_id} is still drafting, so there is nothing to preview yet"
            ).advise(NextStep.RESUME_TO_PREVIEW, run.run_id)
        self.store = store
        self.run = run
        self.count = 0
        self._hash = hashlib.sha256()
        self._done = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for item in self.store.queries.items(self.run.run_id):
            # Recomputed, not read: the fingerprint must cover the text written out.
            digest = intent_digest(item.channel, item.target, item.payload)
            self._hash.update(digest.encode("ascii") + b"\n")
            self.count += 1
            data = item.payload.get("data")
            yield {
                "seq": item.seq,
                "id": item.item_id,
                "to": item.target,
                "channel": item.channel,
                "subject": str(item.payload.get("subject", "")),
                "body": str(item.payload.get("body", "")),
                "deadline": item.payload.get("not_after"),
                "digest": digest,
                "data": data if isinstance(data, dict) else {},
            }
        self._done = True

    def fingerprint(self) -> str:
        """The fingerprint of every notification read (the same bytes as
        intent.run_fingerprint), or NotApproved (CHANGED_SINCE_PLANNED) when the stored
        intents no longer hash to the one computed when the run was planned."""
        assert self._done, "the review was not read to its end"
        h = self._hash.copy()
        h.update(canonical_json(self.run.channel_snapshot).encode("utf-8"))
        fingerprint = "sha256:" + h.hexdigest()
        if fingerprint != self.run.fingerprint:
            raise NotApproved(self.run.run_id, Unapproved.CHANGED_SINCE_PLANNED, run=self.run)
        return fingerprint


def fingerprint_line(fingerprint: str) -> str:
    return f"fingerprint: {fingerprint}"


def iter_json(review: Review) -> Iterator[str]:
    """One JSON document: the run, every notification (encoded as it is read), how many,
    and their fingerprint, or null when the stored intents no longer hash to the run's (the
    command then refuses, as for every format)."""
    pieces = ['{\n  "run_id": ' + json.dumps(review.run.run_id) + ',\n  "notifications": [']
    for row in review:
        pieces.append(("\n    " if review.count == 1 else ",\n    ") + _json(row, "    "))
        if len(pieces) >= _CHUNK:
            yield "".join(pieces)
            pieces.clear()
    pieces.append("\n  ]" if review.count else "]")
    try:
        fingerprint: str | None = review.fingerprint()
    except NotApproved:
        fingerprint = None
    pieces.append(
        f',\n  "count": {review.count},\n  "fingerprint": {json.dumps(fingerprint)}\n}}\n'
    )
    yield "".join(pieces)


def _json(value: Any, indent: str) -> str:
    """`value` as indented JSON whose lines after the first start with `indent`."""
    return json.dumps(value, ensure_ascii=False, indent=2).replace("\n", "\n" + indent)


def iter_jsonl(review: Review) -> Iterator[str]:
    """One JSON object per notification, one per line (UTF-8, not escaped)."""
    lines: list[str] = []
    for row in review:
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        if len(lines) >= _CHUNK:
            yield "".join(lines)
            lines.clear()
    yield "".join(lines)


def iter_csv(review: Review) -> Iterator[str]:
    """A header and one row per notification; every cell a spreadsheet would run as a
    formula starts with `'` (cells.safe_cell); `data` is a JSON object in one cell."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIELDS)
    for n, row in enumerate(review, start=1):
        cells = {**row, "data": json.dumps(row["data"], ensure_ascii=False, sort_keys=True)}
        writer.writerow([safe_cell(cells[name]) for name in FIELDS])
        if n % _CHUNK == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def iter_table(review: Review, rows: int | None = TABLE_ROWS) -> Iterator[str]:
    """The first `rows` notifications as text (every one when None). Every one is still read:
    the fingerprint covers them all, and `review.count` tells the command how many there
    were, to say where to read those not shown."""
    yield f"run {review.run.run_id}: the notifications as they will be sent\n"
    for row in review:
        if rows is not None and review.count > rows:
            continue
        deadline = f", not after {row['deadline']}" if row["deadline"] else ""
        lines = [f"#{row['seq']} {row['id']} → {row['to']} via {row['channel']}{deadline}"]
        lines.append(f"  subject: {row['subject']}")
        for n, text in enumerate(row["body"].splitlines() or [""]):
            lines.append(("  body:    " if n == 0 else "           ") + text)
        if row["data"]:
            lines.append(f"  data:    {json.dumps(row['data'], ensure_ascii=False)}")
        lines.append(f"  digest:  {row['digest']}")
        yield "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[Review], Iterator[str]]] = {
    "table": iter_table,
    "json": iter_json,
    "jsonl": iter_jsonl,
    "csv": iter_csv,
}
