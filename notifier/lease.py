"""Who may work a run: one process at a time, fenced by a version number (docs/design.md section 9).

A lease from this host whose process is gone is dead at once (pid plus the process's start
time, so a recycled pid does not count); a lease from another host is trusted until it
expires. A heartbeat thread renews the lease; if renewal finds the version moved on, the
worker learns it lost the run and stops.

Fencing stops a worker's *writes*, not its *sends*: a worker frozen (SIGSTOP, a paused
container, a VM stall) between point A and its send would, once thawed, send an item a new
holder has already settled and sent. So a send starts only while the lease is *surely* valid:
renewed, on the monotonic clock (which keeps counting while the process is stopped), less
than TTL minus a margin ago. The residual window is a freeze after that check and before the
bytes leave, longer than the margin.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from . import clock
from .records import Run
from .store import StorageFailed, Store

HOST = socket.gethostname()
_ACTIVE_TOKENS: set[str] = set()  # leases held by workers inside this very process
# How much of the TTL a send may not use: a lease renewed longer than TTL * (1 - this) ago is
# no longer "surely" ours (another host may take it over at TTL, by its own clock).
MARGIN_FRACTION = 1 / 3


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None  # a zombie has exited; only its exit status is left to collect
    return fields[19]


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_owner() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": HOST, "pid": pid, "started": process_start(pid), "token": secrets.token_hex(8)}


def holder_alive(owner: dict[str, Any], expires_at: str | None) -> bool:
    """Whether the recorded lease holder may still be working the run."""
    if owner.get("host") == HOST:
        pid = int(owner.get("pid", -1))
        if pid == os.getpid():
            return owner.get("token") in _ACTIVE_TOKENS
        if not pid_exists(pid):
            return False
        started = owner.get("started")
        return started is None or process_start(pid) == started
    return expires_at is not None and clock.parse(expires_at) > clock.now()


def live_holder(store: Store, run: Run) -> dict[str, Any] | None:
    """Who still works `run`: the holder of its lease, or any live worker of a shared run."""
    if run.lease_owner and holder_alive(run.lease_owner, run.lease_expires_at):
        return run.lease_owner
    for worker in store.live_workers(run.run_id):
        if holder_alive(worker.owner, worker.expires_at):
            return worker.owner
    return None


class Lease:
    """A held lease with its heartbeat. Use as a context manager around the work.

    With `shared`, a worker lease of its own beside other workers of the run (PostgreSQL):
    the store is set to fence this process's writes by it and to record it on each claim."""

    def __init__(self, store: Store, run_id: str, ttl_s: float, *, shared: bool = False) -> None:
        self.store = store
        self.run_id = run_id
        self.ttl_s = ttl_s
        self.shared = shared
        self.owner = new_owner()
        # Read before acquiring: the lease is valid from no later than this moment.
        renewed = time.monotonic()
        if shared:
            self.version = store.join_run(run_id, self.owner, ttl_s, holder_alive)
            store.worker_id = self.owner["token"]
        else:
            self.version = store.acquire_lease(run_id, self.owner, ttl_s, holder_alive)
        self._renewed = renewed
        _ACTIVE_TOKENS.add(self.owner["token"])
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def surely_valid(self) -> bool:
        """True while nobody else can have taken the run over: not lost, and renewed less
        than TTL minus a margin ago on the monotonic clock. A send may start only then."""
        if self.lost.is_set():
            return False
        age = time.monotonic() - self._renewed
        return age < self.ttl_s * (1 - MARGIN_FRACTION)

    def _beat(self) -> None:
        try:
            store = self.store.secondary()
        except Exception:
            self.lost.set()  # no heartbeat at all: the lease cannot be kept
            return
        try:
            while not self._stop.wait(self.ttl_s / 3):
                started = time.monotonic()
                try:
                    renewed = self._renew(store)
                except (sqlite3.OperationalError, StorageFailed):
                    # The file was busy for longer than busy_timeout, or the disk is full: try
                    # next beat. A renewal that keeps failing simply ages out of surely_valid().
                    continue
                except Exception:
                    # Anything else is a bug or a broken store: a heartbeat that stops renewing
                    # is a lost lease, so say so rather than die silently.
                    self.lost.set()
                    return
                if not renewed:
                    self.lost.set()
                    return
                self._renewed = started  # the new expiry counts from before the UPDATE
        finally:
            store.close()

    def _renew(self, store: Store) -> bool:
        if self.shared:
            return store.renew_worker(self.owner["token"], self.version, self.ttl_s)
        return store.renew_lease(self.run_id, self.version, self.ttl_s)

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        _ACTIVE_TOKENS.discard(self.owner["token"])
        if not self.lost.is_set():
            # On a full or failing disk the release cannot be written; the lease then dies
            # with this process (same host) or at its expiry, and the first error stands.
            with suppress(StorageFailed):
                if self.shared:
                    self.store.release_worker(self.owner["token"], self.version)
                else:
                    self.store.release_lease(self.run_id, self.version)
        if self.shared:
            self.store.worker_id = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
