"""The audit file: one run exported to a standalone SQLite file through sqlite-utils, for an
auditor who has no access to the database it came from (`notifier export`, `notifier verify
FILE`).

It holds the run, its items, attempts, receipts, manual decisions and events with their
chain, the approval record (in `run`), the suppression entries that applied to it, and two
tables that seal it: `manifest` (each table's row count and digest) and `seal` (the
signature over the manifest, with the key's id). Every row carries its own `seal`: an
HMAC-SHA256 under the audit key (plain SHA-256 without one) of the table's name and the
row's values, so an edit names its row, and the table digest over those seals in key order
names a row deleted or added. Items are searchable by id, recipient and receipt id
(`sqlite-utils search audit.db items ann@example.com --quote`); bodies are exported only
when asked for.

The run is read in one snapshot, each table streamed (a million items in flat memory), and
the file is written under a temporary name and renamed once sealed: a file at the path asked
for is whole.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import multiprocessing
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from notifier.domain.chain import Signer
from notifier.domain.clock import now_iso
from notifier.domain.replay import (
    AttemptRecord,
    Change,
    DecisionRecord,
    Difference,
    EventRecord,
    IntentRecord,
    ItemRecord,
    ReceiptRecord,
    RunRows,
    Table,
)
from notifier.domain.suppression import address_keys
from notifier.domain.verify import RunHead
from notifier.store.audit import AuditRecords
from notifier.store.backend import unwritten_text
from notifier.store.core import Core

FORMAT = "notifier-audit-2"  # -1: before the run's channel snapshot was exported
SEAL = "seal"  # the column every exported row carries
# What reading a file SQLite finds damaged raises (a page overwritten, a copy cut short).
Damaged = sqlite3.DatabaseError
# Errors that say nothing about the file's bytes: another process holds it, or it cannot be
# opened or read now (sqlite3 error codes, their primary part).
_NOT_DAMAGE = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_CANTOPEN,
                         sqlite3.SQLITE_PERM, sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_NOMEM,
                         sqlite3.SQLITE_READONLY})  # fmt: skip


def unreadable_now(exc: sqlite3.DatabaseError) -> bool:
    """Whether `exc` (a Damaged) says the file cannot be read now, not that it is damaged."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _NOT_DAMAGE


_BATCH = 2000  # rows written per INSERT (sqlite-utils' batch): memory stays flat
_COUNT_ITEMS = "SELECT COUNT(*) FROM items WHERE run_id = %(run_id)s"


@dataclass(frozen=True)
class Part:
    """One exported table: its columns (in order), its key (the order its digest follows)
    and how each row is named in a finding."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]


RUN = Part(
    "runs",
    ("run_id", "state", "created_at", "updated_at", "batch_path", "fingerprint",
     "channel_snapshot", "options", "contract_version", "approval", "stop_reason",
     "audit_chain", "audit_key_id"),
    ("run_id",),
)  # fmt: skip
ITEMS = Part(
    "items",
    ("seq", "item_id", "channel", "recipient", "idempotency_key", "intent_digest", "state",
     "attempts", "receipt_id", "last_error", "next_attempt_at"),
    ("seq",),
)  # fmt: skip
BODIES = Part("bodies", ("seq", "payload"), ("seq",))
ATTEMPTS = Part(
    "attempts",
    ("seq", "n", "started_at", "finished_at", "outcome", "http_status", "error",
     "retry_after_s", "waited_s"),
    ("seq", "n"),
)  # fmt: skip
RECEIPTS = Part("receipts", ("seq", "receipt_id", "source", "evidence", "recorded_at"), ("seq",))
DECISIONS = Part("decisions", ("id", "seq", "operator", "at", "decision", "evidence"), ("id",))
EVENTS = Part(
    "events", ("seq_no", "at", "kind", "item_seq", "detail", "prev_hash", "hash"), ("seq_no",)
)
SUPPRESSIONS = Part(
    "suppressions", ("address", "reason", "source", "operator", "created_at"), ("address",)
)
SUPPRESSION_AUDIT = Part(
    "suppression_audit",
    ("id", "at", "operator", "action", "address", "source", "reason"),
    ("id",),
)
PARTS = (RUN, ITEMS, BODIES, ATTEMPTS, RECEIPTS, DECISIONS, EVENTS, SUPPRESSIONS,
         SUPPRESSION_AUDIT)  # fmt: skip
# A file exported before the run's channel snapshot was: read and checked as written, its
# fingerprint not recomputed (verify.py: no snapshot at hand).
_RUN_1 = Part("runs", tuple(c for c in RUN.columns if c != "channel_snapshot"), RUN.key)
_FORMATS = {FORMAT: PARTS, "notifier-audit-1": (_RUN_1, *PARTS[1:])}

_READS = {
    "runs": "SELECT run_id, state, created_at, updated_at, batch_path, fingerprint, "
    "channel_snapshot, options, contract_version, approval, stop_reason, {chain} FROM runs "
    "WHERE run_id = %(run_id)s",
    "items": "SELECT seq, item_id, channel, target, idempotency_key, intent_digest, state, "
    "attempts, receipt_id, last_error, next_attempt_at FROM items WHERE run_id = %(run_id)s "
    "ORDER BY seq",
    "bodies": "SELECT seq, payload FROM items WHERE run_id = %(run_id)s ORDER BY seq",
    "attempts": "SELECT seq, n, started_at, finished_at, outcome, http_status, error, "
    "retry_after_s, waited_s FROM attempts WHERE run_id = %(run_id)s ORDER BY seq, n",
    "receipts": "SELECT i.seq, r.receipt_id, r.source, r.evidence, r.recorded_at "
    "FROM receipts AS r JOIN items AS i ON i.idempotency_key = r.idempotency_key "
    "WHERE i.run_id = %(run_id)s ORDER BY i.seq",
    "decisions": "SELECT id, seq, operator, at, decision, evidence FROM decisions "
    "WHERE run_id = %(run_id)s ORDER BY id",
    "events": "SELECT seq_no, at, kind, item_seq, detail, {links} FROM events "
    "WHERE run_id = %(run_id)s ORDER BY seq_no",
    "suppressed": "SELECT target FROM items WHERE run_id = %(run_id)s AND state = 'suppressed'",
    "suppression_audit": "SELECT id, at, operator, action, address, source, reason "
    "FROM suppression_audit WHERE run_id = %(run_id)s ORDER BY id",
}
# A database from before the chain (m013): its runs and events hold none, named as the
# columns they stand for (PostgreSQL gives unnamed columns one name).
_NO_CHAIN = "NULL AS audit_chain, NULL AS audit_key_id"
_NO_LINKS = "NULL AS prev_hash, NULL AS hash"
_SUPPRESSIONS = (
    "SELECT address, reason, source, operator, created_at FROM suppressions "
    "WHERE address IN ({keys}) ORDER BY address"
)


@dataclass(frozen=True)
class Exported:
    """What an export wrote."""

    run_id: str
    path: Path
    rows: dict[str, int]  # per table
    kind: str  # how it is sealed: the signer's ChainKind value
    key_id: str | None
    with_bodies: bool


def seal(signer: Signer, message: bytes) -> str:
    """An HMAC-SHA256 of `message` under the signer's key, or its SHA-256 without one."""
    if signer.key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.digest(signer.key, message, "sha256").hex()


# One encoder for every row (json.dumps would build one per call).
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def row_form(table: str, values: Sequence[Any]) -> bytes:
    """The bytes a row's seal covers: its table's name and its values, as JSON."""
    return _JSON([table, *values]).encode()


def manifest_form(
    run_id: str,
    exported_at: str,
    with_bodies: bool,
    chained_since: str | None,
    manifest: Iterable[tuple[str, int, str]],
    form: str = FORMAT,
) -> bytes:
    """The bytes the file's signature covers: its format, what was exported, and each
    table's count and digest, in the order of PARTS."""
    return json.dumps(
        [form, run_id, exported_at, with_bodies, chained_since, [list(m) for m in manifest]],
        separators=(",", ":"),
    ).encode()


# ---------------------------------------------------------------- writing


def export(core: Core, run_id: str, to: Path, signer: Signer, *, with_bodies: bool) -> Exported:
    """Write run `run_id` of the store to a new file at `to`. FileExistsError if one is
    there; KeyError for a run the store does not hold."""
    if to.exists():
        raise FileExistsError(to)
    partial = to.with_name(f".{to.name}.partial")
    partial.unlink(missing_ok=True)
    # Created here, so a directory that is not there or not writable is an OSError naming
    # its cause, before a row is read (SQLite would say only "unable to open database file").
    partial.open("xb").close()
    try:
        exported = _write(core, run_id, partial, signer, with_bodies)
        os.replace(partial, to)
    except sqlite3.OperationalError as exc:
        # Only the new file's full disk is the export's to word; anything else, a damaged
        # cell of the database read from among them (the sqlite3 module's own error, with
        # no SQLite code), is named by the store the command opened.
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or code & 0xFF != sqlite3.SQLITE_FULL:
            raise
        # The new file's disk filled (the database read from is not written): the OSError
        # the command layer words for any file it cannot write, the partial file gone.
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(to)) from None
    finally:
        partial.unlink(missing_ok=True)
    return Exported(run_id, to, exported, signer.kind.value, signer.key_id, with_bodies)


def _write(
    core: Core, run_id: str, path: Path, signer: Signer, with_bodies: bool
) -> dict[str, int]:
    engine = core.engine
    chained = "audit_chain" in engine.columns("runs")
    key = {"run_id": run_id}
    db = sqlite_utils.Database(path)
    # The file is private (its temporary name) until it is whole: no journal, no fsync per
    # chunk; it is flushed to disk once, before its rename.
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    manifest: list[tuple[str, int, str]] = []
    with core.snapshot():
        chained_since = AuditRecords(core).chained_since()
        run = engine.execute(
            _READS["runs"].format(chain="audit_chain, audit_key_id" if chained else _NO_CHAIN),
            key,
        ).fetchone()
        if run is None:
            raise KeyError(run_id)
        sources: dict[str, Iterable[Sequence[Any]]] = {
            "runs": [tuple(run)],
            "items": engine.stream(_READS["items"], key),
            "bodies": engine.stream(_READS["bodies"], key) if with_bodies else (),
            "attempts": engine.stream(_READS["attempts"], key),
            "receipts": engine.stream(_READS["receipts"], key),
            "decisions": engine.stream(_READS["decisions"], key),
            "events": engine.stream(
                _READS["events"].format(links="prev_hash, hash" if chained else _NO_LINKS),
                key,
            ),
            "suppressions": _suppressions(core, run_id),
            # A database from before the suppression list (m008, not migrated: an export
            # is read-only) has no audit of it, and no item it held back.
            "suppression_audit": engine.stream(_READS["suppression_audit"], key)
            if engine.has_table("suppression_audit")
            else (),
        }
        items = engine.execute(_COUNT_ITEMS, key).fetchone()[0]
        with second_process(items > APART_ABOVE_ITEMS) as pool:
            for part in PARTS:
                manifest.append(_write_part(db, part, sources[part.name], signer, pool))
    exported_at = now_iso()
    signature = seal(
        signer, manifest_form(run_id, exported_at, with_bodies, chained_since, manifest)
    )
    _table(db, "manifest").insert_all(
        ({"name": n, "rows": c, "sha256": d} for n, c, d in manifest), pk="name"
    )
    _table(db, "seal").insert(
        {"format": FORMAT, "run_id": run_id, "exported_at": exported_at,
         "chained_since": chained_since,
         "with_bodies": int(with_bodies), "kind": signer.kind.value, "key_id": signer.key_id,
         "signature": signature},
        pk="format",
    )  # fmt: skip
    _table(db, "events").create_index(["item_seq", "seq_no"])
    _table(db, "items").enable_fts(["item_id", "recipient", "receipt_id"], create_triggers=False)
    db.conn.commit()
    db.close()
    with path.open("rb") as written:
        os.fsync(written.fileno())
    return {name: count for name, count, _ in manifest}


def _write_part(db: sqlite_utils.Database, part: Part, rows: Iterable[Sequence[Any]],
                signer: Signer, pool: Executor | None) -> tuple[str, int, str]:  # fmt: skip
    """Stream `rows` into the part's table, each with its seal; its count and digest. The
    table is made by sqlite-utils; its rows go in through one prepared INSERT, a chunk at a
    time (sqlite-utils' insert_all inspects every value of every row: five times slower)."""
    digest = hashlib.sha256()
    count = 0
    table = _table(db, part.name)
    table.create({c: _TYPES.get(c, str) for c in (*part.columns, SEAL)}, pk=part.key)
    marks = ", ".join("?" * (len(part.columns) + 1))
    insert = f'INSERT INTO "{part.name}" VALUES ({marks})'
    for chunk, seals in _sealed(part.name, rows, signer, pool):
        digest.update("".join(seals).encode())  # as one update per seal, in key order
        db.conn.executemany(insert, [(*row, s) for row, s in zip(chunk, seals, strict=True)])
        count += len(chunk)
    return part.name, count, digest.hexdigest()


def seal_rows(table: str, rows: Sequence[Sequence[Any]], signer: Signer) -> list[str]:
    """Each row's seal, in order (what the second process runs for an export)."""
    return [seal(signer, row_form(table, row)) for row in rows]


@contextmanager
def second_process(wanted: bool) -> Iterator[Executor | None]:
    """A second process for a large run's seals, to work beside this one: forked, so it
    imports nothing and never runs the caller's main module again (as a spawned one would,
    a library caller's script without its `__main__` guard included), and touches none of
    this process's connections. None when not wanted, where the platform cannot fork, or
    while other threads run (a library caller exporting beside a send)."""
    if (
        not wanted
        or "fork" not in multiprocessing.get_all_start_methods()
        or threading.active_count() > 1  # a lock another thread holds would stay held
    ):
        yield None
        return
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool


def _sealed(table: str, rows: Iterable[Sequence[Any]], signer: Signer,
            pool: Executor | None) -> Iterator[tuple[_Chunk, list[str]]]:  # fmt: skip
    """The rows a chunk at a time, each chunk with its seals: sealed by `pool` with two
    chunks handed ahead, so that it seals while this process writes (or here: `handed`)."""
    source = iter(rows)
    chunks = iter(lambda: [tuple(r) for r in islice(source, _BATCH)], [])
    ahead: deque[tuple[_Chunk, Callable[[], list[str]]]] = deque()
    for chunk in chunks:
        ahead.append((chunk, handed(pool, seal_rows, table, chunk, signer)))
        if len(ahead) > _AHEAD:
            done, seals = ahead.popleft()
            yield done, seals()
    while ahead:
        done, seals = ahead.popleft()
        yield done, seals()


def handed(pool: Executor | None, work: Callable[..., _T], *args: Any) -> Callable[[], _T]:
    """`work(*args)`, handed to `pool` to run while the caller goes on, its result when
    asked; or run here when asked: without a pool, or one that could not start (no fork
    under a process limit) or died (nothing it had is lost: it is done here again)."""
    future = None
    if pool is not None:
        with suppress(BrokenProcessPool, OSError):
            future = pool.submit(work, *args)

    def result() -> _T:
        if future is not None:
            with suppress(BrokenProcessPool):
                return future.result()
        return work(*args)

    return result


_Chunk = list[tuple[Any, ...]]
_T = TypeVar("_T")
_AHEAD = 2  # chunks handed to the sealing process before this one waits for the first


def _table(db: sqlite_utils.Database, name: str) -> sqlite_utils.db.Table:
    return db.table(name)


_TYPES: dict[str, type] = {
    "seq": int, "n": int, "attempts": int, "http_status": int, "id": int, "seq_no": int,
    "item_seq": int, "retry_after_s": float, "waited_s": float,
}  # fmt: skip


def _suppressions(core: Core, run_id: str) -> Iterator[Sequence[Any]]:
    """The suppression entries that held back an item of the run: those under the address
    key of each suppressed item's recipient, a chunk of keys at a time."""
    keys = sorted(
        {
            key
            for (target,) in core.engine.stream(_READS["suppressed"], {"run_id": run_id})
            for key in address_keys(target)
        }
    )
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        names = {f"k{i}": k for i, k in enumerate(chunk)}
        statement = _SUPPRESSIONS.format(keys=", ".join(f"%({n})s" for n in names))
        yield from core.engine.execute(statement, names)


# ---------------------------------------------------------------- reading back

# Above this many items, a file's seals are checked in a second process while this one
# replays its run (api's verify_export): each reads the file on its own, so a million-item
# file takes about the longer of the two. Below it, starting a process costs more than the
# check it takes over.
APART_ABOVE_ITEMS = 20_000


def check_file(path: Path, signer: Signer) -> list[Difference]:
    """AuditFile.check of the file at `path`, opened for it: what the second process runs."""
    exported = AuditFile(path)
    try:
        return exported.check(signer)
    finally:
        exported.close()


class AuditFile:
    """An exported file, read-only: its seals checked (`check`), and its run read as the
    records verify.py checks (an AuditSource), with no access to the database it came from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.text_factory = unwritten_text  # text no export wrote is named, not a crash
        self.db = sqlite_utils.Database(conn)
        try:
            tables = set(self.db.table_names())
        except sqlite3.DatabaseError as exc:
            conn.close()
            with path.open("rb") as head:
                if head.read(16) == b"SQLite format 3\x00":
                    raise  # an SQLite file SQLite finds damaged (cut short): altered
            raise ValueError(f"{path} is not an SQLite file ({exc})") from None
        if not tables & {"seal", "manifest"}:
            conn.close()
            raise ValueError(f"{path} is not a notifier audit file")
        metas = list(self.db["seal"].rows) if "seal" in tables else []
        self.meta: dict[str, Any] = metas[0] if len(metas) == 1 else {}
        self.parts = _FORMATS.get(self.meta.get("format", FORMAT), PARTS)
        # What is not where the format puts it: a table missing, or one added, a column
        # missing or added. A file with any of these is altered, and read no further.
        self.structure = _structure(self.db, tables, self.parts)
        runs = (
            self.db.execute('SELECT COUNT(*) FROM "runs"').fetchone()[0] if "runs" in tables else 0
        )
        if len(metas) != 1:
            self.structure.append(_finding("seal", "the file", "rows", len(metas), 1))
        elif self.meta.get("format") not in _FORMATS:
            self.structure.append(
                _finding("seal", "the file", "format", self.meta.get("format"), FORMAT)
            )
        if runs != 1:
            self.structure.append(_finding("runs", "the run", "rows", runs, 1))

    def close(self) -> None:
        self.db.close()

    def run_ids(self) -> list[str]:
        return [] if self.structure else [str(self.meta["run_id"])]

    def _rows(self, part: Part) -> Iterator[tuple[Any, ...]]:
        columns = ", ".join(f'"{c}"' for c in (*part.columns, SEAL))
        order = ", ".join(f'"{c}"' for c in part.key)
        yield from self.db.execute(f'SELECT {columns} FROM "{part.name}" ORDER BY {order}')

    def check(self, signer: Signer) -> list[Difference]:
        """Every row whose seal is not its values', every table whose count or digest is not
        the manifest's, and a manifest whose signature does not hold. With no key given, a
        keyed file's seals cannot be checked: only that the tables agree with the manifest."""
        if self.structure:
            return list(self.structure)
        kind = str(self.meta["kind"])
        found: list[Difference] = []
        if signer.key is not None and (
            kind != signer.kind.value or self.meta["key_id"] != signer.key_id
        ):
            found.append(_finding("seal", "the file", "key_id", self.meta["key_id"], signer.key_id))
            return found
        checkable = kind == signer.kind.value and self.meta["key_id"] == signer.key_id
        manifest = {r["name"]: (r["rows"], r["sha256"]) for r in self.db["manifest"].rows}
        computed: list[tuple[str, int, str]] = []
        for part in self.parts:
            digest, count = hashlib.sha256(), 0
            for row in self._rows(part):
                values, stored = row[:-1], row[-1]
                if checkable and _own_seal(signer, part.name, values) != stored:
                    found.append(_finding(part.name, _name(part, values), SEAL, stored, None))
                digest.update(str(stored).encode("utf-8", "surrogateescape"))  # as on disk
                count += 1
            computed.append((part.name, count, digest.hexdigest()))
            if manifest.get(part.name) != (count, digest.hexdigest()):
                stored_count, stored_digest = manifest.get(part.name, (None, None))
                what = "rows" if stored_count != count else "sha256"
                found.append(_finding("manifest", part.name, what,
                                      stored_count if what == "rows" else stored_digest,
                                      count if what == "rows" else digest.hexdigest()))  # fmt: skip
        listed = [(n, *manifest[n]) for n in (p.name for p in self.parts) if n in manifest]
        signature = seal(
            signer,
            manifest_form(
                str(self.meta["run_id"]),
                str(self.meta["exported_at"]),
                bool(self.meta["with_bodies"]),
                self.meta.get("chained_since"),
                listed,
                str(self.meta["format"]),
            ),
        )
        if checkable and signature != self.meta["signature"]:
            found.append(
                _finding("seal", "the file", "signature", self.meta["signature"], signature)
            )
        return found

    def reading(self) -> AbstractContextManager[None]:
        return nullcontext()  # a file opened read-only does not change under us

    def item_count(self) -> int:
        return (
            0
            if self.structure
            else int(self.db.execute("SELECT COUNT(*) FROM items").fetchone()[0])
        )

    def head(self, run_id: str) -> RunHead | None:
        if self.structure or run_id != self.meta["run_id"]:
            return None
        part = self.parts[0]
        (run,) = (dict(zip(part.columns, r[:-1], strict=True)) for r in self._rows(part))
        return RunHead(run_id, run["audit_chain"], run["audit_key_id"], run["state"],
                       self.item_count(), run["created_at"], self.meta.get("chained_since"),
                       run["fingerprint"], run["approval"], run.get("channel_snapshot"),
                       run["options"], stopped={"stop_reason": run["stop_reason"]})  # fmt: skip

    def item_seqs(self, run_id: str) -> Iterator[int]:
        for (seq,) in self.db.execute("SELECT seq FROM items ORDER BY seq"):
            yield int(seq)

    def events(self, run_id: str) -> Iterator[EventRecord]:
        for row in self._rows(EVENTS):
            yield EventRecord(run_id, *row[:-1])

    def run_events(self, run_id: str) -> list[EventRecord]:
        rows = self.db.execute(_FILE_RUN_EVENTS)
        return [EventRecord(run_id, *r) for r in rows]

    def item_events(self, run_id: str, seqs: range) -> list[EventRecord]:
        rows = self.db.execute(_FILE_ITEM_EVENTS, (seqs.start, seqs.stop))
        return [EventRecord(run_id, *r) for r in rows]

    def rows(self, run_id: str, seqs: range) -> RunRows:
        span = (seqs.start, seqs.stop)
        items = self.db.execute(_FILE_ITEMS, span).fetchall()
        return RunRows(
            state="",
            items=[ItemRecord(*r[:_ITEM_FIELDS]) for r in items],
            attempts=[AttemptRecord(*r) for r in self.db.execute(_FILE_ATTEMPTS, span)],
            receipts=[ReceiptRecord(*r) for r in self.db.execute(_FILE_RECEIPTS, span)],
            decisions=[],
            intents=[IntentRecord(r[0], *r[_ITEM_FIELDS:]) for r in items],
        )

    def decisions(self, run_id: str) -> list[DecisionRecord]:
        return [DecisionRecord(*r[1:-1]) for r in self._rows(DECISIONS)]


# The reads of a file, by item seq (its events indexed by item_seq at export).
_EVENT_COLUMNS = "seq_no, at, kind, item_seq, detail, prev_hash, hash"
_FILE_RUN_EVENTS = (
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE item_seq IS NULL OR kind = 'decision' "
    "ORDER BY seq_no"
)
_FILE_ITEM_EVENTS = (
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE item_seq >= ? AND item_seq < ? "
    "ORDER BY item_seq, seq_no"
)
# An item's record, then its intent's (its payload only where bodies were exported).
_FILE_ITEMS = (
    "SELECT i.seq, i.item_id, i.state, i.attempts, i.receipt_id, i.last_error, "
    "i.next_attempt_at, i.channel, i.recipient, b.payload, i.intent_digest, "
    "i.idempotency_key FROM items AS i "
    "LEFT JOIN bodies AS b ON b.seq = i.seq WHERE i.seq >= ? AND i.seq < ? ORDER BY i.seq"
)
_ITEM_FIELDS = len(ItemRecord._fields)
_FILE_ATTEMPTS = (
    "SELECT seq, n, started_at, finished_at, outcome, http_status, error, retry_after_s, "
    "waited_s FROM attempts WHERE seq >= ? AND seq < ? ORDER BY seq, n"
)
_FILE_RECEIPTS = (
    "SELECT seq, receipt_id, source, evidence, recorded_at FROM receipts "
    "WHERE seq >= ? AND seq < ? ORDER BY seq"
)


# The tables sqlite-utils makes for the search index over items, and the index on events.
_SEARCH = {"items_fts", "items_fts_data", "items_fts_idx", "items_fts_docsize", "items_fts_config"}
_FORMAT_TABLES = {*(p.name for p in PARTS), "manifest", "seal"}


def _structure(
    db: sqlite_utils.Database, tables: set[str], parts: Sequence[Part]
) -> list[Difference]:
    """Every table, view or trigger the format does not make, every table it makes that is
    missing, and every part whose columns are not the format's (`parts`)."""
    found = [_finding("manifest", name, "table", None, name)
             for name in sorted(_FORMAT_TABLES - tables)]  # fmt: skip
    made = db.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')"
    ).fetchall()
    found += [_finding("manifest", name, kind, name, None) for kind, name in made
              if name not in _FORMAT_TABLES | _SEARCH]  # fmt: skip
    for part in parts:
        if part.name in tables:
            columns = tuple(c.name for c in db.table(part.name).columns)
            if columns != (*part.columns, SEAL):
                found.append(_finding("manifest", part.name, "columns", list(columns),
                                      [*part.columns, SEAL]))  # fmt: skip
    return found


def _own_seal(signer: Signer, table: str, values: Sequence[Any]) -> str | None:
    """The seal of a row's values; None for values no export writes (a blob, which JSON
    cannot hold): then no seal is theirs, and the row is named, not a crash."""
    try:
        return seal(signer, row_form(table, values))
    except (TypeError, ValueError):
        return None


def _name(part: Part, values: Sequence[Any]) -> str:
    key = ", ".join(f"{c} {values[part.columns.index(c)]}" for c in part.key)
    return f"{part.name[:-1] if part.name.endswith('s') else part.name} {key}"


def _finding(table: str, row: str, column: str, stored: Any, expected: Any) -> Difference:
    return Difference(Table(table), row, Change.DIFFERS, column, stored, expected)
