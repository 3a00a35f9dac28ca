"""What the tests read of a database, in one place: the runs, items, attempts, receipts and
events as typed rows, on either store. A test asks `ws.ledger.states()` rather than writing
SQL, so a schema change touches this file, not the suite. The changes a test makes behind
notifier's back on purpose (a lease taken over, an intent rewritten, an approval garbled) are
here too, named, in `Forge` (`ws.forge`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
Write = Callable[[str, Sequence[Any]], None]


@dataclass(frozen=True)
class RunRow:
    run_id: str
    state: str
    fingerprint: str | None
    approval: str | None
    stop_reason: str | None
    stop_cause: str | None
    paused_until: str | None
    cancel_requested_at: str | None
    lease_version: int
    key_nonce: str | None
    content_fingerprint: str | None


@dataclass(frozen=True)
class ItemRow:
    run_id: str
    seq: int
    item_id: str
    channel: str
    target: str
    idempotency_key: str
    intent_digest: str
    state: str
    attempts: int
    receipt_id: str | None
    last_error: str | None
    worker_id: str | None


@dataclass(frozen=True)
class AttemptRow:
    run_id: str
    seq: int
    n: int
    started_at: str
    finished_at: str | None
    outcome: str | None
    http_status: int | None
    error: str | None


@dataclass(frozen=True)
class EventRow:
    run_id: str
    kind: str
    item_seq: int | None
    detail: str | None
    seq_no: int


_RUN = (
    "run_id, state, fingerprint, approval, stop_reason, stop_cause, paused_until, "
    "cancel_requested_at, lease_version, key_nonce, content_fingerprint"
)
_ITEM = (
    "run_id, seq, item_id, channel, target, idempotency_key, intent_digest, state, attempts, "
    "receipt_id, last_error, worker_id"
)
_ATTEMPT = "run_id, seq, n, started_at, finished_at, outcome, http_status, error"


class Ledger:
    """The read model over one workspace's database (`ws.ledger`)."""

    def __init__(self, query: Query, *, postgres: bool = False) -> None:
        self._query = query
        self._postgres = postgres

    # --- runs ----------------------------------------------------------------------------

    def runs(self) -> list[RunRow]:
        """Every run, oldest first."""
        rows = self._query(f"SELECT {_RUN} FROM runs ORDER BY created_at, run_id", ())
        return [RunRow(*row) for row in rows]

    def run(self, run_id: str | None = None) -> RunRow:
        """The run `run_id`, or the only run there is."""
        runs = [r for r in self.runs() if run_id is None or r.run_id == run_id]
        assert len(runs) == 1, f"expected one run{f' {run_id}' if run_id else ''}: {runs}"
        return runs[0]

    # --- items ---------------------------------------------------------------------------

    def items(self, run_id: str | None = None) -> list[ItemRow]:
        """The items of `run_id` (else of every run), by run and seq."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id else ("", ())
        rows = self._query(f"SELECT {_ITEM} FROM items {where} ORDER BY run_id, seq", params)
        return [ItemRow(*row) for row in rows]

    def item(self, item_id: str, run_id: str | None = None) -> ItemRow:
        found = [i for i in self.items(run_id) if i.item_id == item_id]
        assert len(found) == 1, f"expected one item {item_id}: {found}"
        return found[0]

    def states(self, run_id: str | None = None) -> dict[str, str]:
        """item id -> state."""
        return {i.item_id: i.state for i in self.items(run_id)}

    def state_counts(self, run_id: str | None = None) -> dict[str, int]:
        """state -> how many items are in it (states with none are absent)."""
        return dict(Counter(i.state for i in self.items(run_id)))

    def keys(self, state: str | None = None, run_id: str | None = None) -> list[str]:
        """The idempotency keys, by seq; only those in `state` when given."""
        return [i.idempotency_key for i in self.items(run_id) if state in (None, i.state)]

    # --- attempts, receipts, events --------------------------------------------------------

    def attempts(self, seq: int | None = None, run_id: str | None = None) -> list[AttemptRow]:
        """Every attempt, by run, seq and number; of item `seq` when given."""
        rows = self._query(f"SELECT {_ATTEMPT} FROM attempts ORDER BY run_id, seq, n", ())
        return [
            a
            for a in (AttemptRow(*row) for row in rows)
            if (seq is None or a.seq == seq) and (run_id is None or a.run_id == run_id)
        ]

    def receipt_count(self) -> int:
        ((n,),) = self._query("SELECT COUNT(*) FROM receipts", ())
        return int(n)

    def events(self, kind: str | None = None, run_id: str | None = None) -> list[EventRow]:
        """The events in the order they were written; of `kind` when given."""
        rows = self._query(
            "SELECT run_id, kind, item_seq, detail, seq_no FROM events ORDER BY run_id, seq_no", ()
        )
        return [
            e
            for e in (EventRow(*row) for row in rows)
            if (kind is None or e.kind == kind) and (run_id is None or e.run_id == run_id)
        ]

    # --- leases ----------------------------------------------------------------------------

    def lease_owner(self, run_id: str | None = None) -> str | None:
        """Who holds the run's lease on paper, as stored (JSON: host, pid, token), or None."""
        rows = self._query("SELECT run_id, lease_owner FROM runs", ())
        owners = [owner for rid, owner in rows if run_id in (None, rid)]
        assert len(owners) == 1, f"expected one run: {rows}"
        return None if owners[0] is None else str(owners[0])

    def live_worker_pids(self, run_id: str | None = None) -> list[int]:
        """The pids of the workers registered live (a run shared through PostgreSQL)."""
        rows = self._query("SELECT run_id, pid FROM workers WHERE state = 'live'", ())
        return sorted(int(pid) for rid, pid in rows if run_id in (None, rid))

    # --- receipts and decisions -------------------------------------------------------------

    def receipt_sources(self) -> dict[str, str]:
        """idempotency key -> how its receipt was recorded (an answer, a query, an operator)."""
        rows = self._query("SELECT idempotency_key, source FROM receipts", ())
        return {str(key): str(source) for key, source in rows}

    def decisions(self, run_id: str | None = None) -> list[tuple[int, str, str]]:
        """The operator's decisions on items, in the order made: (seq, decision, evidence)."""
        rows = self._query("SELECT run_id, seq, decision, evidence FROM decisions ORDER BY id", ())
        return [(int(s), str(d), str(e)) for rid, s, d, e in rows if run_id in (None, rid)]

    def next_attempts(self, state: str | None = None) -> dict[str, str | None]:
        """item id -> when it is next tried or asked about (its next_attempt_at), of the
        items in `state` when given."""
        rows = self._query("SELECT item_id, state, next_attempt_at FROM items", ())
        return {str(i): (None if t is None else str(t)) for i, s, t in rows if state in (None, s)}

    def suppression_audit(self) -> list[tuple[str, str, str]]:
        """Every change to the suppression list, in the order made: (action, address, source)."""
        rows = self._query("SELECT action, address, source FROM suppression_audit ORDER BY id", ())
        return [(str(a), str(address), str(s)) for a, address, s in rows]

    def retry_afters(self, run_id: str | None = None) -> dict[tuple[int, int], float | None]:
        """(seq, attempt number) -> the Retry-After its answer carried, in seconds, as stored."""
        rows = self._query("SELECT run_id, seq, n, retry_after_s FROM attempts", ())
        return {(int(s), int(n)): r for rid, s, n, r in rows if run_id in (None, rid)}

    def draft_by_seq(
        self, run_id: str | None = None
    ) -> dict[int, tuple[str, str | None, int | None]]:
        """seq -> (state, subject, input tokens) of each row's draft (a --compose run)."""
        rows = self._query("SELECT run_id, seq, state, subject, input_tokens FROM drafts", ())
        return {int(s): (st, subj, tok) for rid, s, st, subj, tok in rows if run_id in (None, rid)}

    def receipts(self) -> dict[str, dict[str, Any]]:
        """idempotency key -> its receipt: intent_digest, receipt_id, source (how it was
        learnt: the answer, a query, by hand), evidence and recorded_at."""
        rows = self._query(
            "SELECT idempotency_key, intent_digest, receipt_id, source, evidence, recorded_at "
            "FROM receipts",
            (),
        )
        names = ("intent_digest", "receipt_id", "source", "evidence", "recorded_at")
        return {row[0]: dict(zip(names, row[1:], strict=True)) for row in rows}

    def event_numbers(self, run_id: str | None = None) -> list[int]:
        """The events' seq_no, in the order they were written (of `run_id` when given)."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id else ("", ())
        rows = self._query(f"SELECT seq_no FROM events {where} ORDER BY run_id, seq_no", params)
        return [int(n) for (n,) in rows]

    def approval(self, run_id: str | None = None) -> dict[str, Any] | None:
        """The approval record of `run_id` (else of the only run), decoded; None if none."""
        raw = self.run(run_id).approval
        return None if raw is None else dict(json.loads(raw))

    def payload(self, seq: int, run_id: str | None = None) -> dict[str, Any]:
        """Item `seq`'s stored payload (of `run_id`, else of the only run with that seq)."""
        where, params = ("AND run_id = ?", (seq, run_id)) if run_id else ("", (seq,))
        ((raw,),) = self._query(f"SELECT payload FROM items WHERE seq = ? {where}", params)
        return dict(json.loads(raw))

    def channel_snapshot(self, run_id: str | None = None) -> dict[str, Any]:
        """The channel definitions stored with `run_id` (else the only run) when planned."""
        run = self.run(run_id).run_id
        ((raw,),) = self._query("SELECT channel_snapshot FROM runs WHERE run_id = ?", (run,))
        return dict(json.loads(raw))

    def drafts(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The composed drafts, by run and seq: seq, state, source, model, input_tokens,
        output_tokens, error, subject."""
        names = (
            "run_id", "seq", "state", "source", "model", "input_tokens", "output_tokens", "error",
            "subject",
        )  # fmt: skip
        rows = self._query(f"SELECT {', '.join(names)} FROM drafts ORDER BY run_id, seq", ())
        found = [dict(zip(names, row, strict=True)) for row in rows]
        return [d for d in found if run_id is None or d["run_id"] == run_id]

    def draft_chunks(self) -> list[dict[str, Any]]:
        """The Message Batches chunks, by run and chunk: chunk, state, created, batch_id."""
        names = ("run_id", "chunk", "state", "created", "batch_id")
        rows = self._query(
            f"SELECT {', '.join(names)} FROM draft_chunks ORDER BY run_id, chunk", ()
        )
        return [dict(zip(names, row, strict=True)) for row in rows]

    def workers(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The workers' leases of a shared run (of every run unless `run_id`), oldest first:
        worker_id, run_id, host, pid, state, version, heartbeat_at, expires_at."""
        names = (
            "worker_id", "run_id", "host", "pid", "state", "version", "heartbeat_at", "expires_at",
        )  # fmt: skip
        rows = self._query(
            f"SELECT {', '.join(names)} FROM workers ORDER BY joined_at, worker_id", ()
        )
        found = [dict(zip(names, row, strict=True)) for row in rows]
        return [w for w in found if run_id is None or w["run_id"] == run_id]

    # --- schema, counters, suppressions, schedules ------------------------------------------

    def migrations(self) -> list[str]:
        """The names of the migrations applied to the database, sorted."""
        table = "notifier_migrations" if self._postgres else "_sqlite_migrations"
        return sorted(str(name) for (name,) in self._query(f"SELECT name FROM {table}", ()))

    def counters(self) -> set[tuple[str, str, int]]:
        """The per-run counters as kept (not counted from the items): (run_id, state, n), for
        each n that is not 0."""
        rows = self._query("SELECT run_id, state, n FROM run_counts WHERE n != 0", ())
        return {(str(run), str(state), int(n)) for run, state, n in rows}

    def run_counts(self, run_id: str | None = None) -> dict[str, int]:
        """state -> n, as the counters of `run_id` (else of the only run) keep it."""
        run = self.run(run_id).run_id
        return {state: n for rid, state, n in self.counters() if rid == run}

    def suppressions(self) -> list[tuple[str, str | None, str]]:
        """The suppression list, by address: (address, reason, source)."""
        rows = self._query("SELECT address, reason, source FROM suppressions ORDER BY address", ())
        return [(str(a), None if r is None else str(r), str(s)) for a, r, s in rows]

    def suppression_operators(self) -> list[str]:
        """Who made each change to the suppression list, in the order made (beside
        suppression_audit's action, address and source)."""
        return [
            str(o) for (o,) in self._query("SELECT operator FROM suppression_audit ORDER BY id", ())
        ]

    def schedules(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Each item's schedule, by run and seq: item_id, not_before, send_window, send_tz,
        identity, and the row's data columns as stored in its payload."""
        names = ("run_id", "item_id", "not_before", "send_window", "send_tz", "identity")
        rows = self._query(
            f"SELECT {', '.join(names)}, payload FROM items ORDER BY run_id, seq", ()
        )
        found = [
            {**dict(zip(names, row[:-1], strict=True)), "data": json.loads(row[-1])["data"]}
            for row in rows
        ]
        return [s for s in found if run_id is None or s["run_id"] == run_id]

    def tables(self) -> list[str]:
        """The tables of the database (of the schema, on PostgreSQL), sorted."""
        if self._postgres:
            # pg_tables, not information_schema (slow: it checks privileges on every table).
            sql = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        else:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        return sorted(str(name) for (name,) in self._query(sql, ()))

    def rows(self, table: str, order: str = "1") -> list[tuple[Any, ...]]:
        """Every row of `table`, every column as stored, ordered by `order`: for a test about
        a table as a whole (that nothing in it changed, that no cell holds a secret)."""
        return self._query(f'SELECT * FROM "{table}" ORDER BY {order}', ())


class Forge:
    """What a test changes behind notifier's back on purpose, each change named (`ws.forge`):
    a lease taken over, a lease held elsewhere, an intent or an approval tampered with, an
    answer rewritten. The one place tests write the schema."""

    def __init__(self, write: Write) -> None:
        self._write = write

    def run_lease_taken_over(self) -> None:
        """Another process took every run's lease: its fencing version moved on."""
        self._write("UPDATE runs SET lease_version = lease_version + 1", ())

    def worker_leases_taken_over(self) -> None:
        """Every live worker's lease (a run shared through PostgreSQL) moved on."""
        self._write("UPDATE workers SET version = version + 1 WHERE state = 'live'", ())

    def lease_held_by(
        self, owner: dict[str, Any], expires_at: str, run_id: str | None = None
    ) -> None:
        """The run's lease (every run's, without `run_id`) recorded as held by `owner`
        (host, pid, token, ...) until `expires_at`."""
        where, params = (" WHERE run_id = ?", (run_id,)) if run_id else ("", ())
        self._write(
            f"UPDATE runs SET lease_owner = ?, lease_expires_at = ?{where}",
            (json.dumps(owner), expires_at, *params),
        )

    def intent(self, seq: int, payload: str, digest: str, run_id: str | None = None) -> None:
        """Item `seq`'s stored payload (canonical JSON) and intent digest rewritten."""
        where, params = (" AND run_id = ?", (run_id,)) if run_id else ("", ())
        self._write(
            f"UPDATE items SET payload = ?, intent_digest = ? WHERE seq = ?{where}",
            (payload, digest, seq, *params),
        )

    def run_fingerprint(self, fingerprint: str) -> None:
        """Every run's stored fingerprint rewritten."""
        self._write("UPDATE runs SET fingerprint = ?", (fingerprint,))

    def approval(self, record: str | None) -> None:
        """Every run's approval record replaced by `record` (raw JSON), or removed."""
        self._write("UPDATE runs SET approval = ?", (record,))

    def throttled_answer(
        self, run_id: str, seq: int, retry_after_s: float, finished_at: str
    ) -> None:
        """Item `seq`'s attempts recorded as throttled with Retry-After `retry_after_s`,
        answered at `finished_at`."""
        self._write(
            "UPDATE attempts SET outcome = 'throttled', retry_after_s = ?, finished_at = ? "
            "WHERE run_id = ? AND seq = ?",
            (retry_after_s, finished_at, run_id, seq),
        )

    def run_state(self, run_id: str, state: str) -> None:
        """Run `run_id` put in `state` with no move of the state machine, as a process that
        took it up would leave it."""
        self._write("UPDATE runs SET state = ? WHERE run_id = ?", (state, run_id))

    def worker_lease_expires(self, worker_id: str, expires_at: str) -> None:
        """`worker_id`'s lease (a run shared through PostgreSQL) recorded as expiring at
        `expires_at`: in the past, a worker on another host that counts as dead."""
        self._write(
            "UPDATE workers SET expires_at = ? WHERE worker_id = ?", (expires_at, worker_id)
        )
