"""The store's shared core: connection, write transactions, events and state moves. All
SQL lives in this package; every state change goes through state_machine.py with a
conditional UPDATE, and every fenced write is fenced by its lease version: the run's lease
(RunFence), or one worker's own lease (WorkerFence), fixed when the core is made."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from notifier.domain.errors import NextStep, NotifierError
from notifier.domain.records import Outcome, Run, StopCause, run_from_row
from notifier.domain.state_machine import (
    ACTIVE_ITEM_STATES,
    ItemState,
    ItemTrigger,
    RunState,
    RunTrigger,
    item_next,
    run_next,
)
from notifier.store.backend import Engine, Fence, snapshot
from notifier.store.chaining import run_columns
from notifier.store.exceptions import LeaseLost, LossCause, LostRace, WriteConflict
from notifier.store.migrations import stored_content_fingerprint
from notifier.store.statements import core as sql

# What a failed write leaves behind, as every storage failure message says.
ROLLED_BACK = (
    "The write was rolled back whole: every outcome recorded before it is safe, and anything "
    "in flight is settled by query on resume."
)

# How many times a write the server aborted to break a deadlock runs in all (see retried).
_CONFLICT_RUNS = 3
_P = ParamSpec("_P")
_R = TypeVar("_R")


def retried(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A write method run again when the server aborted its transaction as a deadlock's
    victim (WriteConflict, PostgreSQL only): nothing of it was written, and its fence and
    reads are simply made again. The writes of a run take their rows in one order (the run's
    row last, at COMMIT: postgres.py), and a live worker's reap skips a row another
    transaction holds, so this is for the rare cycle that order cannot rule out."""

    @functools.wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        for attempt in range(1, _CONFLICT_RUNS + 1):
            try:
                return method(*args, **kwargs)
            except WriteConflict:
                if attempt == _CONFLICT_RUNS:
                    raise
        raise AssertionError("unreachable")

    return run


@dataclass(frozen=True)
class RunFence:
    """Fenced by the run's one lease (runs.lease_version): one process alone works the run,
    and its claims record no worker."""


@dataclass(frozen=True)
class WorkerFence:
    """Fenced by the worker lease `worker_id` (workers.version), one of many workers sharing
    a run: a reaped worker's version has moved on, and its claims record it, so a live worker
    can settle exactly the items of a dead one."""

    worker_id: str


# Whose lease fences a core's writes; fixed when the core is made (Store.for_worker makes
# another core over the same connection rather than changing this one).
Fencing = RunFence | WorkerFence
RUN_FENCE = RunFence()


class Core:
    """What every part of the store shares, over one engine (backend.py): the write
    transaction (fenced by the lease version of its `fencing`), the event log, the
    conditional moves through the state machine, and the run rows.

    Its SQL, as every part's, is in statements/, written once for both engines."""

    def __init__(self, engine: Engine, fencing: Fencing = RUN_FENCE) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self._fencing = fencing

    @property
    def fencing(self) -> Fencing:
        """Whose lease fences this core's writes; read-only, as fixed when it was made."""
        return self._fencing

    @property
    def worker_id(self) -> str | None:
        """The worker whose lease fences this core (claims record it), None under the run's
        lease."""
        return self._fencing.worker_id if isinstance(self._fencing, WorkerFence) else None

    @property
    def path(self) -> Path | str:
        """For SQLite the file; for PostgreSQL the server and database (never a password),
        as messages name it."""
        return self.engine.path

    # ---------------------------------------------------------------- writing

    @contextmanager
    def write(self, run_id: str | None = None, lease_version: int | None = None) -> Iterator[None]:
        """One write transaction, holding what it writes from its BEGIN (SQLite: BEGIN
        IMMEDIATE, the write lock up front: a deferred BEGIN can fail with
        SQLITE_BUSY_SNAPSHOT when a concurrent `cancel` commits between our read and our
        write, and busy_timeout cannot retry that). With `lease_version`, the transaction is
        fenced: it aborts if the lease moved on."""
        errors = self.dialect.storage_errors
        try:
            self._begin_fenced(run_id, lease_version)
        except errors as exc:
            self._roll_back()
            raise self._storage_failure(exc) from exc
        except BaseException:
            self._roll_back()
            raise
        try:
            yield
            self._commit()
        except errors as exc:
            self._roll_back()
            raise self._write_failure(exc, run_id, lease_version) from exc
        except BaseException:
            self._roll_back()
            raise

    def _commit(self) -> None:
        self.engine.commit()

    def _begin_fenced(self, run_id: str | None, lease_version: int | None) -> None:
        """BEGIN, then with `lease_version` the fence (an engine may send both at once)."""
        if lease_version is None:
            self.engine.begin_write(None)
            return
        row = self.engine.begin_write(self._fence_query(run_id))
        self._check_fence(run_id, lease_version, row)

    def snapshot(self) -> AbstractContextManager[None]:
        """Reads that see one committed state, whatever other processes commit meanwhile."""
        return snapshot(self.engine)

    def _fence_query(self, run_id: str | None) -> Fence:
        """The read of the version the caller's lease must still hold, and its one key:
        the run's, or under a WorkerFence the worker's own (a reaped worker's version has
        moved on)."""
        if isinstance(self._fencing, WorkerFence):
            return sql.WORKER_LEASE_FENCE, self._fencing.worker_id
        return sql.RUN_LEASE_FENCE, run_id

    @staticmethod
    def _check_fence(run_id: str | None, lease_version: int, row: Any) -> None:
        if row is None or row[0] != lease_version:
            raise LeaseLost(f"run {run_id}: {LossCause.TAKEN_OVER}", LossCause.TAKEN_OVER)

    def _write_failure(
        self, exc: Exception, run_id: str | None, lease_version: int | None
    ) -> NotifierError:
        """What a failed write means: the engine's storage failure, or, for a fenced write
        whose lease was taken over meanwhile (a process frozen inside its transaction, whose
        session the server ended, and reaped since), LeaseLost: nothing more is its to write."""
        failure = self._storage_failure(exc)
        if lease_version is None or isinstance(failure, LeaseLost):
            return failure
        if self._fence_moved(run_id, lease_version):
            return LeaseLost(f"run {run_id}: {LossCause.TAKEN_OVER}", LossCause.TAKEN_OVER)
        return failure

    def _fence_moved(self, run_id: str | None, lease_version: int) -> bool:
        """Whether the lease's version has moved on, read on a connection of its own (this
        one may be gone); False when that cannot be read either."""
        try:
            other = self.engine.secondary()
        except Exception:
            return False
        try:
            key: str | None = run_id
            statement = sql.RUN_LEASE_VERSION
            if isinstance(self._fencing, WorkerFence):
                statement, key = sql.WORKER_LEASE_VERSION, self._fencing.worker_id
            row = other.execute(statement, {"key": key}).fetchone()
        except Exception:
            return False
        finally:
            other.close()
        return row is None or row[0] != lease_version

    def _roll_back(self) -> None:
        self.engine.roll_back()

    def _storage_failure(self, exc: Exception) -> NotifierError:
        """Name what went wrong with the database, the safe state it leaves, and the fix
        (each engine names its own causes)."""
        return self.engine.storage_failure(exc)

    def event(self, run_id: str, kind: str, item_seq: int | None, detail: Any, at: str) -> None:
        """One event, numbered after the run's last (PostgreSQL numbers it at COMMIT)."""
        self.engine.event(run_id, kind, item_seq, as_json(detail), at)

    def events(self, run_id: str, kind: str, seqs: Sequence[int], detail: Any, at: str) -> None:
        """`event` for several items at once, with one detail for all."""
        self.engine.events(run_id, kind, seqs, as_json(detail), at)

    def each_event(self, run_id: str, kind: str, details: Mapping[int, Any], at: str) -> None:
        """`event` for several items at once, each with its own detail, in seq order."""
        seqs = sorted(details)
        self.engine.events(run_id, kind, seqs, {s: as_json(details[s]) for s in seqs}, at)

    def move_item(
        self,
        run_id: str,
        seq: int,
        current: ItemState,
        trigger: ItemTrigger,
        at: str,
        *,
        also: Mapping[str, Any] | None = None,
        **sets: Any,
    ) -> ItemState:
        """The conditional move and its event, which carries what the move wrote (`set`: the
        columns `sets` gives) and `also` (the attempt closed, the receipt stored with it), so
        replay.py can rebuild the item from its events alone."""
        target = item_next(trigger, current)
        cursor = self.engine.execute(
            sql.move_item(current, tuple(sets)),
            {"target": target.value, "at": at, "run_id": run_id, "seq": seq, **sets},
        )
        if cursor.rowcount != 1:
            raise LostRace(
                f"run {run_id} item {seq}: another process moved it first (it was no longer "
                f"{current.value} for {trigger}); this process stopped without overwriting "
                "anything."
            ).advise(NextStep.STATUS, run_id)
        detail: dict[str, Any] = {"from": current.value, "to": target.value}
        if sets:
            detail["set"] = sets
        if also:
            detail.update(also)
        self.event(run_id, trigger, seq, detail, at)
        return target

    def move_run(self, run_id: str, trigger: RunTrigger, at: str, **sets: Any) -> RunState:
        if ("stop_reason" in sets) != ("stop_cause" in sets):
            # The prose and its cause go together: no reader ever parses the prose.
            raise ValueError(f"run {run_id}: a stop reason is written with its stop cause")
        sets = {k: v.value if isinstance(v, StopCause) else v for k, v in sets.items()}
        current = self.locked_run(run_id).state
        target = run_next(trigger, current)
        cursor = self.engine.execute(
            sql.move_run(tuple(sets)),
            {"target": target.value, "at": at, "run_id": run_id, "current": current.value, **sets},
        )
        if cursor.rowcount != 1:
            raise LostRace(
                f"run {run_id}: another process moved it first (it was no longer "
                f"{current.value} for {trigger}); this process stopped without overwriting "
                "anything."
            ).advise(NextStep.STATUS, run_id)
        self.event(
            run_id, f"run_{trigger}", None, {"from": current.value, "to": target.value, **sets}, at
        )
        return target

    def insert_row(self, table: str, row: dict[str, Any]) -> None:
        self.engine.execute(sql.insert_row(table, tuple(row)), row)

    def insert_run(self, row: dict[str, Any]) -> None:
        """A new run's row, recording how its events are chained and its key's id."""
        self.insert_row("runs", {**row, **run_columns(self.engine.signer)})

    def runs(self) -> list[Run]:
        return [run_from_row(r) for r in self.engine.execute(sql.RUNS)]

    def locked_run(self, run_id: str) -> Run:
        """The run, read to be written in this transaction: its row is held to COMMIT, so a
        state read here is still the state when the conditional move runs."""
        row = self.engine.execute(sql.LOCKED_RUN, {"run_id": run_id}).fetchone()
        if row is None:
            raise KeyError(run_id)
        return run_from_row(row)

    def get_run(self, run_id: str) -> Run:
        row = self.engine.execute(sql.RUN, {"run_id": run_id}).fetchone()
        if row is None:
            raise KeyError(run_id)
        return run_from_row(row)

    def runs_with_content_fingerprint(self, content_fingerprint: str) -> list[Run]:
        if "content_fingerprint" not in self.engine.columns("runs"):
            # Opened read-only before m002 was applied: compute what m002 would store.
            return [
                run
                for run in self.runs()
                if stored_content_fingerprint(self.engine, run.run_id) == content_fingerprint
            ]
        rows = self.engine.execute(
            sql.RUNS_WITH_CONTENT_FINGERPRINT, {"content_fingerprint": content_fingerprint}
        )
        return [run_from_row(r) for r in rows]


def as_json(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _all_active(states: Sequence[ItemState]) -> bool:
    return all(s in ACTIVE_ITEM_STATES for s in states)


def plain_ack(o: Outcome) -> bool:
    """An answered send as the pipeline records it: batched by Ledger._record_acks."""
    return (
        o.trigger == ItemTrigger.ACK
        and o.expected is ItemState.IN_FLIGHT
        and o.receipt_source is not None
        and o.attempt_outcome is not None
    )
