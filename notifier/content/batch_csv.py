"""Reading and validating a batch CSV: the whole file is checked before anything is stored.

Every problem is reported with the line it starts on, so an operator can fix the file in one
pass instead of discovering problems one run at a time. The file is read as a stream (one
row at a time), so a million-row batch costs no more memory than a ten-row one.
"""

from __future__ import annotations

import bisect
import csv
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, Protocol

from notifier.channels import target_problem
from notifier.content.text_rules import MAX_FIELD_CHARS, text_problems
from notifier.content.unsubscribe import COLUMNS as UNSUBSCRIBE_COLUMNS
from notifier.content.unsubscribe import row_unsubscribe
from notifier.domain import clock
from notifier.domain.errors import BadInput
from notifier.domain.intent import invisible_character, nfc
from notifier.domain.text import CONTROL, control_character

RESERVED = ("to", "subject", "body", "id", "channel", "not_after", *UNSUBSCRIBE_COLUMNS)
MAX_REPORTED = 20
# Problems kept in memory (all are counted): a file with a million bad rows must not hold a
# million messages; BatchError prints the first MAX_REPORTED and the count.
MAX_KEPT = 1000
# Rows whose ids are checked for duplicates at once (one query per chunk, not per row).
ID_CHUNK = 5000


class BatchRow(NamedTuple):
    """One validated row. A named tuple rather than a frozen dataclass: a million-row plan
    makes a million of them, and a frozen dataclass's __init__ costs about 3 µs each (one
    object.__setattr__ per field) where a tuple costs a fraction of that."""

    line: int
    seq: int
    item_id: str
    to: str
    subject: str
    body: str
    channel: str
    data: dict[str, str]
    not_after: str | None = None  # UTC ISO 8601 (clock.iso): the deadline, part of the intent
    own_id: bool = False  # item_id came from the file's `id` column, not the row's position
    # One-click unsubscribe (RFC 8058), as intent.unsubscribe_url/_mailto normalised them:
    # part of the intent, so of its digest, only when the row has one.
    unsubscribe_url: str | None = None
    unsubscribe_mailto: str | None = None
    # When it may go out (schedule.py): not part of the intent.
    not_before: str | None = None
    send_window: str | None = None
    send_tz: str | None = None


@dataclass(frozen=True)
class Problem:
    line: int
    message: str


class Problems:
    """The problems found so far, in file order: every one counted, the first MAX_KEPT
    kept. A duplicate id is noticed a chunk of rows late (see IdLedger), so a problem may
    arrive after one on a later line: it is put in its place."""

    def __init__(self) -> None:
        self.kept: list[Problem] = []
        self.count = 0

    def extend(self, problems: Iterator[Problem]) -> None:
        for problem in problems:
            self.append(problem)

    def append(self, problem: Problem) -> None:
        self.count += 1
        if self.kept and problem.line < self.kept[-1].line:
            bisect.insort(self.kept, problem, key=lambda p: p.line)
            del self.kept[MAX_KEPT:]
        elif len(self.kept) < MAX_KEPT:
            self.kept.append(problem)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0


class IdLedger(Protocol):
    """Where the item ids seen so far are noted (a scratch table for a streamed plan).
    Noted in chunks: asking row by row costs a query per row."""

    def note(self, item_id: str, line: int) -> None:
        """Remember that `line` uses `item_id`."""
        ...

    def duplicates(self) -> list[tuple[int, str, int]]:
        """(line, id, first line) for every id noted since the last call that an earlier
        line already used, in file order."""
        ...


class _IdsInMemory:
    """For the list-based reader (--compose, whose rows are all held anyway)."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.found: list[tuple[int, str, int]] = []

    def note(self, item_id: str, line: int) -> None:
        first = self.lines.setdefault(item_id, line)
        if first != line:
            self.found.append((line, item_id, first))

    def duplicates(self) -> list[tuple[int, str, int]]:
        found, self.found = self.found, []
        return found


class BatchError(BadInput):
    """The file cannot be planned; `problems` says where and how to fix it."""

    def __init__(self, path: Path, problems: list[Problem] | Problems) -> None:
        self.path = path
        if isinstance(problems, Problems):
            self.problems, self.total = problems.kept, problems.count
        else:
            self.problems, self.total = problems, len(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = self.total
        head = f"{self.path}: {n} problem{'s' if n != 1 else ''}; nothing was stored."
        lines = [head]
        for p in self.problems[:MAX_REPORTED]:
            lines.append(f"  line {p.line}: {p.message}")
        if n > MAX_REPORTED:
            lines.append(f"  … and {n - MAX_REPORTED} more.")
        lines.append("Fix the file and run the command again.")
        return "\n".join(lines)


def read_batch(
    path: Path,
    channel_types: Mapping[str, str],
    default_channel: str,
    not_after: datetime | None = None,
    require_unsubscribe: Collection[str] = frozenset(),
) -> list[BatchRow]:
    """Parse and validate `path`; raise BatchError listing every problem found. `not_after`
    (send --not-after) is every row's deadline; a row's own `not_after` may only make it
    earlier. All rows in a list: for --compose; `send` streams with stream_batch."""
    problems = Problems()
    rows = list(
        stream_batch(
            path,
            channel_types,
            default_channel,
            problems,
            _IdsInMemory(),
            not_after,
            require_unsubscribe,
        )
    )
    if problems:
        raise BatchError(path, problems)
    return rows


def stream_batch(
    path: Path,
    channel_types: Mapping[str, str],
    default_channel: str,
    problems: Problems,
    ids: IdLedger,
    not_after: datetime | None = None,
    require_unsubscribe: Collection[str] = frozenset(),
) -> Iterator[BatchRow]:
    """Yield each valid row as it is read, noting every problem (with its line) in
    `problems`; the caller raises BatchError once the stream is exhausted if there is any.
    A file that cannot be read or is not UTF-8 raises BatchError at once (its problems are
    about the file, not its rows). `require_unsubscribe`: channels whose rows must each
    have an unsubscribe_url or unsubscribe_mailto."""
    try:
        handle = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise BatchError(path, [Problem(0, f"cannot read the file ({exc.strerror})")]) from exc
    try:
        with handle:
            yield from _parse(
                path,
                handle,
                channel_types,
                default_channel,
                not_after,
                problems,
                ids,
                require_unsubscribe,
            )
    except UnicodeDecodeError as exc:
        raise BatchError(path, _decoding_problems(path)) from exc
    except OSError as exc:
        raise BatchError(path, [Problem(0, f"cannot read the file ({exc.strerror})")]) from exc


def parse_deadline(text: str) -> datetime:
    """ISO 8601 with a zone (`2026-12-01T09:00:00+01:00`, `…Z`); ValueError otherwise: a
    deadline without a zone means a different moment on every machine."""
    value = datetime.fromisoformat(text.strip())
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{text!r} has no time zone: add one, e.g. +00:00 or Z")
    return clock.in_range(value, text, latest=clock.LAST)


def _decoding_problems(path: Path) -> Problems:
    """Every line that is not UTF-8, read line by line from the raw bytes."""
    problems = Problems()
    with path.open("rb") as raw:
        for number, line in enumerate(raw, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = line[exc.start : exc.start + 4].hex(" ")
                problems.append(
                    Problem(
                        number,
                        f"bytes {bad} at column {exc.start + 1} are not UTF-8: "
                        "save the file as UTF-8 (CSV UTF-8 in a spreadsheet)",
                    )
                )
    return problems


def _parse(
    path: Path,
    text: Iterator[str],
    channel_types: Mapping[str, str],
    default_channel: str,
    not_after: datetime | None,
    problems: Problems,
    ids: IdLedger,
    require_unsubscribe: Collection[str] = frozenset(),
) -> Iterator[BatchRow]:
    # The limit is process-wide in the csv module; notifier reads batches only here.
    csv.field_size_limit(MAX_FIELD_CHARS)
    reader = csv.reader(text, strict=True)
    header: list[str] | None = None
    folded: list[str] = []  # the header's names as a repeat of it is compared
    layout = _Layout.of([], {})
    start = 1
    rows = 0
    try:
        for record in reader:
            line, start = start, reader.line_num + 1
            if not any(cell.strip() for cell in record):
                continue  # blank lines (and rows of bare commas) carry no notification
            if header is None:
                header = [cell.strip() for cell in record]
                folded = [name.casefold() for name in header]
                columns = _check_header(header, line, problems)
                if problems:
                    break
                layout = _Layout.of(header, columns)
                continue
            if [cell.strip().casefold() for cell in record] == folded:
                # Two files joined (`cat a.csv b.csv`): on a channel whose `to` may be any
                # text, this row would be a notification to "to".
                problems.append(Problem(line, "repeats the header row: remove the line"))
                continue
            rows += 1
            row = _check_row(
                record,
                line,
                rows,
                layout,
                ids,
                channel_types,
                default_channel,
                problems,
                not_after,
                require_unsubscribe,
            )
            if rows % ID_CHUNK == 0:
                _note_duplicates(ids, problems)
            if row is not None:
                yield row
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            message = (
                f"a field is longer than {MAX_FIELD_CHARS // (1024 * 1024)} MiB: shorten it, "
                "or look for a quote that is opened and never closed"
            )
        else:
            message = f"malformed CSV ({exc}): close every quote and double any quote inside"
        problems.append(Problem(start, message))
    _note_duplicates(ids, problems)
    if header is None and not problems:
        problems.append(
            Problem(1, "the file is empty: add a header row (to,subject,body) and rows")
        )
    elif header is not None and not rows and not problems:
        problems.append(
            Problem(2, "the file has a header but no rows: add one row per notification")
        )


def _note_duplicates(ids: IdLedger, problems: Problems) -> None:
    for line, item_id, first in ids.duplicates():
        problems.append(
            Problem(
                line, f"duplicate id {item_id!r} (first used on line {first}): ids must be unique"
            )
        )


def _check_header(header: list[str], line: int, problems: Problems) -> dict[str, int]:
    columns: dict[str, int] = {}
    seen: dict[str, int] = {}
    for index, name in enumerate(header):
        if not name:
            problems.append(
                Problem(line, f"header column {index + 1} has no name: name it or delete it")
            )
            continue
        folded = name.casefold()
        if folded in seen:
            problems.append(
                Problem(
                    line,
                    f"duplicate header {name!r} (columns {seen[folded] + 1} and {index + 1}): "
                    "every column needs its own name",
                )
            )
            continue
        seen[folded] = index
        if folded in RESERVED:
            columns[folded] = index
    if "to" not in columns and not problems:
        if len(header) == 1 and ";" in header[0]:
            names = [name.strip().casefold() for name in header[0].split(";")]
            message = (
                "the header is one column holding semicolons: this file is separated by "
                "semicolons, but notifier reads commas. Export it as CSV with commas "
                "(in a spreadsheet: CSV UTF-8, comma-delimited)"
            )
            if "to" not in names:
                message += " and name the recipient column `to`"
        elif any("@" in cell for cell in header):
            message = (
                "this looks like a data row, not a header: add a first line naming the "
                "columns, e.g. to,subject,body"
            )
        else:
            message = "the header has no `to` column: name the recipient column `to`"
        problems.append(Problem(line, message))
    return columns


def _deadline(
    text: str, default: datetime | None, line: int, problems: Problems
) -> datetime | None:
    """The row's deadline: its own `not_after`, never later than --not-after."""
    if not text.strip():
        return default
    try:
        own = parse_deadline(text)
    except ValueError as exc:
        problems.append(
            Problem(
                line,
                f"`not_after` {exc}: use ISO 8601 with a zone, e.g. 2026-12-01T09:00:00+01:00",
            )
        )
        return default
    return own if default is None else min(own, default)


@dataclass(frozen=True)
class _Layout:
    """Where each reserved column sits (None: absent) and which columns are data, worked
    out once from the header rather than once per row."""

    width: int
    to: int | None
    subject: int | None
    body: int | None
    id: int | None
    channel: int | None
    not_after: int | None
    unsubscribe_url: int | None
    unsubscribe_mailto: int | None
    data: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, header: list[str], columns: dict[str, int]) -> _Layout:
        data = tuple(
            (index, name) for index, name in enumerate(header) if name.casefold() not in RESERVED
        )
        at = columns.get
        return cls(
            len(header),
            at("to"),
            at("subject"),
            at("body"),
            at("id"),
            at("channel"),
            at("not_after"),
            at("unsubscribe_url"),
            at("unsubscribe_mailto"),
            data,
        )


def _cell(record: list[str], index: int | None) -> str:
    return record[index] if index is not None else ""


def _check_row(
    record: list[str],
    line: int,
    seq: int,
    layout: _Layout,
    ids: IdLedger,
    channel_types: Mapping[str, str],
    default_channel: str,
    problems: Problems,
    not_after: datetime | None = None,
    require_unsubscribe: Collection[str] = frozenset(),
) -> BatchRow | None:
    if len(record) != layout.width:
        problems.append(
            Problem(
                line,
                f"{len(record)} fields but the header has {layout.width}: quote any field "
                'that contains a comma ("a, b") and check for missing or extra commas',
            )
        )
        return None
    before = len(problems)
    to = _cell(record, layout.to).strip()
    subject = _cell(record, layout.subject)
    if not to:
        problems.append(Problem(line, "empty `to`: every row needs a recipient"))
    elif CONTROL.search(to):
        problems.append(Problem(line, "`to` contains a line break or control character: remove it"))
    elif (hidden := invisible_character(to)) is not None:
        problems.append(
            Problem(line, f"`to` holds the invisible character U+{ord(hidden):04X}: remove it")
        )
    problems.extend(Problem(line, p) for p in text_problems(subject, _cell(record, layout.body)))
    item_id = str(seq)
    if layout.id is not None:
        item_id = record[layout.id].strip()
        if not item_id:
            problems.append(Problem(line, "empty `id`: give every row an id, or drop the column"))
        elif (control := control_character(item_id)) is not None:
            # An id is typed after `--item` and listed by `status`; PostgreSQL stores no NUL.
            problems.append(
                Problem(line, f"`id` contains the control character {control}: remove it")
            )
        else:
            # In NFC, as the row's identity has it (intent.row_identity): one id written in
            # two forms is one row. A duplicate is reported when the chunk is checked.
            ids.note(nfc(item_id), line)
    channel = _cell(record, layout.channel).strip() or default_channel
    kind = channel_types.get(channel)
    if kind is None:
        known = ", ".join(sorted(channel_types))
        problems.append(
            Problem(
                line,
                f"unknown channel {channel!r}: define [channels.{channel}] in notifier.toml "
                f"or use one of: {known}",
            )
        )
    elif to and (problem := target_problem(kind, to, channel)) is not None:
        problems.append(Problem(line, problem))
    deadline = _deadline(_cell(record, layout.not_after), not_after, line, problems)
    cells = (_cell(record, layout.unsubscribe_url), _cell(record, layout.unsubscribe_mailto))
    url, mailto, why = row_unsubscribe(*cells, channel, channel in require_unsubscribe)
    problems.extend(Problem(line, message) for message in why)
    if len(problems) > before:
        return None
    return BatchRow(
        line,
        seq,
        item_id,
        to,
        subject,
        _cell(record, layout.body),
        channel,
        {name: record[index] for index, name in layout.data},
        clock.iso(deadline) if deadline is not None else None,
        layout.id is not None,
        url,
        mailto,
    )
