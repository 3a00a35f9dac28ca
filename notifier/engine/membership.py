"""Who may work a run, fenced by a version number (docs/design.md section 9): the run's one
lease (SoleLease), or, where the store lets workers share a run, a worker lease each
(SharedLease). Both are a Lease; for_sending() says which one a process that sends holds.

A lease from this host and PID namespace whose process is gone is dead at once (pid plus
the process's start time, so a recycled pid does not count); any other lease is trusted until
it expires: from another host, from another PID namespace on this one (a container on the
host's network shares its host name, not its pids), or from a process this one cannot see.
A heartbeat thread renews the lease; if renewal finds the version moved on, the worker
learns it lost the run and stops.

Fencing stops a worker's *writes*, not its *sends*: a worker frozen (SIGSTOP, a paused
container, a VM stall) between point A and its send would, once thawed, send an item a new
holder has already settled and sent. So a send starts only while the lease is *surely* valid:
renewed less than TTL minus a margin ago, on the monotonic clock (which keeps counting while
the process is stopped) and on the boot-time clock (which also counts a suspend of the whole
machine, a laptop's lid or `systemctl suspend`, that Linux's monotonic clock skips),
whichever says longer. The residual window is a freeze after that check and before the
bytes leave, longer than the margin, and a VM paused by its hypervisor, which may see
neither clock move.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol

from notifier.domain import clock
from notifier.domain.records import Run
from notifier.engine.run_control import RunControl
from notifier.store import LeaseLost, LossCause, StorageFailed, Store
from notifier.store.pids import pid_exists

HOST = socket.gethostname()
_ACTIVE_TOKENS: set[str] = set()  # leases held by workers inside this very process
# How much of the TTL a send may not use: a lease renewed longer than TTL * (1 - this) ago is
# no longer "surely" ours (another host may take it over at TTL, by its own clock).
MARGIN_FRACTION = 1 / 3


_EXITED = ("Z", "X")  # a zombie, or dead: /proc/PID/stat's state


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if unknown."""
    fields = _stat(pid)
    if fields is None or fields[0] in _EXITED:
        return None
    return fields[19]


def _pid_space() -> str | None:
    """This machine's boot and this process's PID namespace: where a pid names one process.
    None where either cannot be read."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot} {namespace}"


PID_SPACE = _pid_space()


def _clocks() -> tuple[float, float]:
    """Now on the monotonic clock and on the boot-time clock. Linux's CLOCK_MONOTONIC (Python's
    time.monotonic) does not count the time the machine was suspended; CLOCK_BOOTTIME does, as
    the other hosts' wall clocks do when they judge this lease's expiry. Where there is no
    boot-time clock, the monotonic one stands for it."""
    monotonic = time.monotonic()
    try:
        boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        boot = monotonic
    return monotonic, boot


def new_owner() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "host": HOST,
        "pid_space": PID_SPACE,
        "pid": pid,
        "started": process_start(pid),
        "token": secrets.token_hex(8),
    }


def holder_alive(owner: dict[str, Any], expires_at: str | None) -> bool:
    """Whether the recorded lease holder may still be working the run: judged by its pid
    only where that pid names a process this one can see (same host and PID space), else by
    its lease's expiry."""
    if owner.get("token") in _ACTIVE_TOKENS:
        return True  # held inside this very process
    if owner.get("host") == HOST and PID_SPACE is not None and owner.get("pid_space") == PID_SPACE:
        pid = int(owner.get("pid", -1))
        if pid == os.getpid():
            return False  # this process, which no longer holds it
        if not pid_exists(pid):
            return False
        fields = _stat(pid)  # one read of /proc/PID/stat; None where it cannot be read
        if fields is not None and fields[0] in _EXITED:
            return False  # exited, not collected yet (a zombie)
        started = owner.get("started")
        if started is None:
            return True
        if fields is not None:
            return bool(fields[19] == started)
        # Its /proc entry cannot be read (hidepid, another user's process): not known dead.
    return expires_at is not None and clock.parse(expires_at) > clock.now()


def live_holder(store: Store, run: Run) -> dict[str, Any] | None:
    """Who still works `run`: the holder of its lease, or any live worker of a shared run."""
    if run.lease_owner and holder_alive(run.lease_owner, run.lease_expires_at):
        return run.lease_owner
    for worker in store.leases.live_workers(run.run_id):
        if holder_alive(worker.owner, worker.expires_at):
            return worker.owner
    return None


class Lease(Protocol):
    """A held lease with its heartbeat, used as a context manager around the work: what the
    commands and the runner read of it, whichever kind it is."""

    run_id: str
    # The store the holder works the run through, fenced by this lease: the store the lease
    # was taken on (SoleLease), or one made for this worker over its connection (SharedLease).
    store: Store
    version: int  # the fencing version every write of the holder carries
    # Where a loss is recorded (run_control.RunControl.lose), and read: the run control of
    # the process that holds the lease.
    control: RunControl

    def surely_valid(self) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> Lease: ...

    def __exit__(self, *exc: object) -> None: ...


# How a lease of one kind is taken: SoleLease or SharedLease (store, run_id, ttl_s).
LeaseKind = Callable[[Store, str, float], Lease]


def for_sending(store: Store) -> LeaseKind:
    """The lease a process that sends a run holds: a worker lease of its own where the store
    lets many processes share a run (more may join it from any machine), else the run's one
    lease. Every other command that works a run holds the run's one lease (SoleLease)."""
    return SharedLease if store.shares_runs else SoleLease


class _HeldLease(ABC):
    """What both kinds share: the owner, the heartbeat thread that renews the lease every
    third of its TTL, surely_valid() and release(). A kind says how its lease is acquired,
    renewed and released."""

    def __init__(self, store: Store, run_id: str, ttl_s: float) -> None:
        self.run_id = run_id
        self.ttl_s = ttl_s
        self.owner = new_owner()
        self.store = self._fenced(store)
        # Read before acquiring: the lease is valid from no later than this moment.
        renewed = _clocks()
        # Held before the lease row commits: another worker of this process that looks at
        # the run in between must find this holder alive, not reap it as dead.
        _ACTIVE_TOKENS.add(self.owner["token"])
        try:
            self.version = self._acquire()
        except BaseException:
            _ACTIVE_TOKENS.discard(self.owner["token"])
            raise
        self._renewed = renewed
        self.control = RunControl()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    @abstractmethod
    def _fenced(self, store: Store) -> Store:
        """The store this lease's holder writes through, fenced by this lease."""

    @abstractmethod
    def _acquire(self) -> int:
        """Take the lease (LeaseHeld if someone else holds it); its fencing version."""

    @abstractmethod
    def _renew(self, store: Store) -> bool:
        """Extend the lease through `store` (the heartbeat's own connection); False if it
        was taken over meanwhile."""

    @abstractmethod
    def _release(self) -> None:
        """Give the lease up, so the next holder need not wait for it to expire."""

    def surely_valid(self) -> bool:
        """True while nobody else can have taken the run over: not lost, and renewed less
        than TTL minus a margin ago on the monotonic and boot-time clocks (`_clocks`). A send
        may start only then."""
        if self.control.lost:
            return False
        # The longer of the two ages: a suspend of the machine counts (see _clocks).
        age = max(now - then for now, then in zip(_clocks(), self._renewed, strict=True))
        return age < self.ttl_s * (1 - MARGIN_FRACTION)

    def _beat(self) -> None:
        try:
            store = self.store.secondary()
        except Exception:
            self.control.lose(LossCause.UNKEPT)  # no heartbeat at all: the lease cannot be kept
            return
        try:
            while not self._stop.wait(self.ttl_s / 3):
                if self.control.lost:
                    # This process learned it lost (a sender found the lease stale, the
                    # committer found it taken): a renewal now would tell every other
                    # process it is still at work while it is stopping.
                    return
                started = _clocks()
                try:
                    renewed = self._renew(store)
                except StorageFailed:
                    self.control.renewed(ok=False)
                    # The database was busy for longer than its lock timeout, or its disk is
                    # full (the store raises every storage error of its engine as
                    # StorageFailed): try next beat. A renewal that keeps failing simply ages
                    # out of surely_valid().
                    continue
                except Exception:
                    # Anything else is a bug or a broken store: a heartbeat that stops renewing
                    # is a lost lease, so say so rather than die silently.
                    self.control.lose(LossCause.UNKEPT)
                    return
                if not renewed:
                    self.control.lose(LossCause.TAKEN_OVER)
                    return
                self._renewed = started  # the new expiry counts from before the UPDATE
                self.control.renewed(ok=True)
        finally:
            store.close()

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        # Released even when lost: the release is fenced by this lease's version, so it
        # changes nothing once another process took the lease; a lease that only went stale
        # (or that a renewal racing the loss extended) is then not left looking live until
        # it expires. Nothing of this process sends any more by now (the runner has closed
        # its senders). On a full or failing disk, or a connection the server ended, the
        # release cannot be written; the lease then dies with this process (same host) or
        # at its expiry, and the first error stands.
        try:
            with suppress(StorageFailed, LeaseLost):
                self._release()
        finally:
            # Given up only once the release is written: until then another worker of this
            # process must still find this holder alive.
            _ACTIVE_TOKENS.discard(self.owner["token"])

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SoleLease(_HeldLease):
    """The run's one lease: one process alone works the run (on SQLite always; on
    PostgreSQL for every command but sending, e.g. cancel, reconcile, drafting)."""

    def _fenced(self, store: Store) -> Store:
        return store  # a store is fenced by the run's lease unless made for a worker

    def _acquire(self) -> int:
        return self.store.leases.acquire_lease(self.run_id, self.owner, self.ttl_s, holder_alive)

    def _renew(self, store: Store) -> bool:
        return store.leases.renew_lease(self.run_id, self.version, self.ttl_s)

    def _release(self) -> None:
        self.store.leases.release_lease(self.run_id, self.version)


class SharedLease(_HeldLease):
    """A worker lease of its own, beside the other workers sending the same run (PostgreSQL).
    Its `store` is made for this worker (Store.for_worker, over the same connection): it
    fences the holder's writes by this lease and records it on each claim, so a live worker
    can settle exactly the items of a dead one. The store the lease was taken on is left as
    it was, fenced by the run's lease."""

    def _fenced(self, store: Store) -> Store:
        return store.for_worker(self.owner["token"])

    def _acquire(self) -> int:
        return self.store.leases.join_run(self.run_id, self.owner, self.ttl_s, holder_alive)

    def _renew(self, store: Store) -> bool:
        return store.leases.renew_worker(self.owner["token"], self.version, self.ttl_s)

    def _release(self) -> None:
        self.store.leases.release_worker(self.owner["token"], self.version)
