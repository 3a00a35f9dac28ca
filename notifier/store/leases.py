"""Leases: who may work a run, each fenced by a version number.

The run's own lease is exclusive: one `send`/`resume` on an SQLite file, and on either engine
the commands that must work alone (`cancel` closing a run, `reconcile`). On PostgreSQL, the
processes that send (`send`, `resume`, `worker`) each hold a worker lease of their own in
`workers`, so several can work one run at once; an exclusive lease is refused while any of
them lives, and fences the dead ones out when taken."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from notifier.domain import clock
from notifier.domain.records import Run, Worker
from notifier.store import statements
from notifier.store.core import Core, as_json, retried
from notifier.store.exceptions import LeaseHeld
from notifier.store.statements import leases as sql

Alive = Callable[[dict[str, Any], str | None], bool]
# How many items one statement adopts at most (a bound on its parameters).
_ADOPT_AT_ONCE = 500


@dataclass(frozen=True)
class Adopted:
    """What a worker adopted (the seqs), and who had left it: how many workers that died
    (fenced out as dead, now or before) and that exited (released their lease), and how
    many of the items no worker held."""

    seqs: list[int] = field(default_factory=list)
    died: int = 0
    exited: int = 0
    unheld: int = 0


class Leases:
    """Who may work a run: take, renew and release the fenced leases."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.engine = core.engine

    # ---------------------------------------------------------------- the run's lease

    @retried
    def acquire_lease(
        self, run_id: str, owner: dict[str, Any], ttl_s: float, holder_alive: Alive
    ) -> int:
        """Take the run for `owner` unless a live holder has it (the run's lease, or any
        worker's); returns the new fencing version. `holder_alive(owner, expires_at)`
        decides liveness (engine/membership.py). Dead workers are fenced out in the same
        transaction."""
        at = clock.now()
        with self.core.write():
            # Dead workers are fenced out before the run's row is taken: a reap waits for a
            # commit the worker may still be making, and that commit ends by taking the run's
            # row (postgres.py), which this transaction must not be holding meanwhile.
            self._check_free(self.core.get_run(run_id), run_id, holder_alive, clock.iso(at))
            run = self.core.locked_run(run_id)  # from here on no worker joins, nor takes it
            self._check_free(run, run_id, holder_alive, clock.iso(at))
            version = run.lease_version + 1
            self.engine.execute(
                sql.TAKE_LEASE,
                {
                    "owner": as_json(owner),
                    "version": version,
                    "expires_at": clock.iso(clock.later(ttl_s, at)),
                    "run_id": run_id,
                    "previous": run.lease_version,
                },
            )
            self.core.event(
                run_id,
                "lease_taken",
                None,
                {"owner": owner, "version": version, "previous": run.lease_owner},
                clock.iso(at),
            )
        return version

    def _check_free(self, run: Run, run_id: str, holder_alive: Alive, at: str) -> None:
        """LeaseHeld unless no live process holds the run; the dead workers are reaped."""
        if run.lease_owner and holder_alive(run.lease_owner, run.lease_expires_at):
            raise LeaseHeld(run.lease_owner, run.lease_expires_at)
        for worker in self._live_workers(run_id):
            if holder_alive(worker.owner, worker.expires_at):
                raise LeaseHeld(worker.owner, worker.expires_at)
            if not self._reap(worker, at) and self._still_live(run_id, worker.worker_id):
                # It renewed its lease after it was read: alive after all.
                raise LeaseHeld(worker.owner, worker.expires_at)

    def _still_live(self, run_id: str, worker_id: str) -> bool:
        return any(w.worker_id == worker_id for w in self._live_workers(run_id))

    def renew_lease(self, run_id: str, lease_version: int, ttl_s: float) -> bool:
        with self.core.write():
            cursor = self.engine.execute(
                sql.RENEW_LEASE,
                {
                    "expires_at": clock.iso(clock.later(ttl_s)),
                    "run_id": run_id,
                    "lease_version": lease_version,
                },
            )
        return bool(cursor.rowcount == 1)

    def release_lease(self, run_id: str, lease_version: int) -> None:
        with self.core.write():
            self.engine.execute(
                sql.RELEASE_LEASE, {"run_id": run_id, "lease_version": lease_version}
            )

    # ---------------------------------------------------------------- worker leases

    @retried
    def join_run(
        self, run_id: str, owner: dict[str, Any], ttl_s: float, holder_alive: Alive
    ) -> int:
        """A worker lease of its own for `owner` (its token is the worker id), beside any
        other live worker; refused (LeaseHeld) while a live process holds the run's
        exclusive lease. Returns the worker's fencing version."""
        at = clock.now()
        with self.core.write():
            # The run's row, held to COMMIT: an exclusive lease is taken under it too.
            run = self.core.locked_run(run_id)
            if run.lease_owner and holder_alive(run.lease_owner, run.lease_expires_at):
                raise LeaseHeld(run.lease_owner, run.lease_expires_at)
            self.core.insert_row(
                "workers",
                {
                    "worker_id": owner["token"],
                    "run_id": run_id,
                    "host": owner["host"],
                    "pid": owner["pid"],
                    "process_start": owner.get("started"),
                    "pid_space": owner.get("pid_space"),
                    "state": "live",
                    "version": 1,
                    "joined_at": clock.iso(at),
                    "heartbeat_at": clock.iso(at),
                    "expires_at": clock.iso(clock.later(ttl_s, at)),
                },
            )
            self.core.event(run_id, "worker_joined", None, {"owner": owner}, clock.iso(at))
        return 1

    @retried
    def renew_worker(self, worker_id: str, version: int, ttl_s: float) -> bool:
        """Extend a live worker's lease; False once it was fenced out (reaped)."""
        at = clock.now()
        with self.core.write():
            cursor = self.engine.execute(
                sql.RENEW_WORKER,
                {
                    "at": clock.iso(at),
                    "expires_at": clock.iso(clock.later(ttl_s, at)),
                    "worker_id": worker_id,
                    "version": version,
                },
            )
        return bool(cursor.rowcount == 1)

    @retried
    def release_worker(self, worker_id: str, version: int) -> None:
        with self.core.write():
            self.engine.execute(sql.RELEASE_WORKER, {"worker_id": worker_id, "version": version})

    def live_workers(self, run_id: str) -> list[Worker]:
        """The workers whose lease rows say live (dead or not: lease.holder_alive decides),
        each with how many items it holds in flight."""
        if not self.engine.has_table("workers"):
            return []  # opened read-only before m005
        return self._live_workers(run_id)

    @cached_property
    def _live_workers_statement(self) -> str:
        """Read once per store: opened read-only, a database from before m015 has no
        pid_space, and never gains it under this store (one migrated meanwhile by another
        process is read as before: a NULL pid space only makes a holder wait for expiry)."""
        return sql.live_workers("pid_space" in self.engine.columns("workers"))

    def _live_workers(self, run_id: str) -> list[Worker]:
        rows = self.engine.execute(self._live_workers_statement, {"run_id": run_id}).fetchall()
        return [Worker(*tuple(row)) for row in rows]

    @retried
    def adopt_orphans(
        self, run_id: str, worker_id: str, version: int, holder_alive: Alive
    ) -> Adopted:
        """Fence out every dead worker of the run and adopt what they left: their in-flight
        items, and unknown items no live worker holds, now held by `worker_id`, which must
        settle them (by query) before it sends anything again. Returns what was adopted,
        and who had left it."""
        candidates = [
            w
            for w in self._live_workers(run_id)
            if w.worker_id != worker_id and not holder_alive(w.owner, w.expires_at)
        ]
        if not candidates and not self._orphans(run_id, worker_id):
            return Adopted()  # the usual case: one read, no write transaction
        at = clock.now_iso()
        with self.core.write(run_id, version):
            for worker in candidates:  # before the run's row: see acquire_lease
                # A dead worker whose transaction is still open (frozen inside it, or cut
                # off by the network) is skipped, not waited for: this committer's own
                # writes go on, and the next look reaps it once the server has ended that
                # session. Its items are no orphans meanwhile: its row still says live.
                self._reap(worker, at, wait=False)
            # Two live workers reaping at once adopt in turn: the second finds nothing left.
            self.core.locked_run(run_id)
            held = self.engine.execute(
                sql.ORPHANS_HELD, {"run_id": run_id, "worker_id": worker_id}
            ).fetchall()
            adopted = [seq for (seq, _, _) in held]
            for start in range(0, len(adopted), _ADOPT_AT_ONCE):
                chunk = adopted[start : start + _ADOPT_AT_ONCE]
                self.engine.execute(
                    sql.adopt_items(len(chunk)),
                    {"worker_id": worker_id, "run_id": run_id, **statements.bound("s", chunk)},
                )
        holders = {holder: state for (_, holder, state) in held if state is not None}
        return Adopted(
            adopted,
            died=sum(1 for state in holders.values() if state == "reaped"),
            exited=sum(1 for state in holders.values() if state == "released"),
            unheld=sum(1 for (_, _, state) in held if state not in ("reaped", "released")),
        )

    def held_in_flight(self, run_id: str, worker_id: str) -> list[int]:
        """The items `worker_id` holds in flight (the seqs, in order)."""
        rows = self.engine.execute(sql.HELD_IN_FLIGHT, {"run_id": run_id, "worker_id": worker_id})
        return [seq for (seq,) in rows.fetchall()]

    def _orphans(self, run_id: str, worker_id: str) -> list[int]:
        """Items in flight or unknown that no live worker holds."""
        return [
            seq
            for (seq,) in self.engine.execute(
                sql.ORPHANS, {"run_id": run_id, "worker_id": worker_id}
            ).fetchall()
        ]

    @retried
    def leave_unless_last(
        self, run_id: str, worker_id: str, version: int, holder_alive: Alive, *, wait_for_busy: bool
    ) -> str:
        """How a worker of a shared run ends: "last" when no other live worker is left (it
        closes the run itself); "wait" (with `wait_for_busy`) while another live worker still
        holds items; else "left": its lease is released in this same transaction, so of
        two workers leaving at once exactly one finds itself last."""
        with self.core.write(run_id, version):
            # Two workers leaving at once read each other's lease in turn, never both live.
            self.core.locked_run(run_id)
            others = [
                w
                for w in self._live_workers(run_id)
                if w.worker_id != worker_id and holder_alive(w.owner, w.expires_at)
            ]
            if not others:
                return "last"
            if wait_for_busy and any(w.in_flight or self._holds_unknown(w) for w in others):
                return "wait"
            self.engine.execute(sql.LEAVE_RUN, {"worker_id": worker_id})
            self.core.event(
                run_id,
                "worker_left",
                None,
                {"worker": worker_id, "others": len(others)},
                clock.now_iso(),
            )
            return "left"

    def _holds_unknown(self, worker: Worker) -> bool:
        """Whether `worker` holds an unknown item it will ask about again (query_delay)."""
        return bool(
            self.engine.execute(
                sql.HOLDS_UNKNOWN, {"run_id": worker.run_id, "worker_id": worker.worker_id}
            ).fetchone()
        )

    def _reap(self, worker: Worker, at: str, *, wait: bool = True) -> bool:
        """Fence a dead worker out: its renewals and fenced writes fail from now on. Only
        the lease `worker` was read with is reaped: one renewed since is left live. Without
        `wait`, a worker whose own transaction is open is left as it is. Whether it was."""
        cursor = self.engine.execute(
            sql.REAP_WORKER if wait else sql.REAP_WORKER_UNLESS_BUSY,
            {"worker_id": worker.worker_id, "version": worker.version,
             "expires_at": worker.expires_at},
        )  # fmt: skip
        if cursor.rowcount != 1:
            return False
        self.core.event(worker.run_id, "worker_reaped", None, {"worker": worker.worker_id}, at)
        return True
