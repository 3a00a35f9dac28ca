"""Leases: one worker at a time, fenced by a version number."""

from __future__ import annotations

from typing import Any

from .. import clock
from .core import StoreCore, _dump
from .exceptions import LeaseHeld


class Leases(StoreCore):
    """Who may work a run: take, renew and release the fenced lease."""

    # ---------------------------------------------------------------- leases

    def acquire_lease(
        self, run_id: str, owner: dict[str, Any], ttl_s: float, holder_alive: Any
    ) -> int:
        """Take the run for `owner` unless a live holder has it; returns the new fencing
        version. `holder_alive(owner, expires_at)` decides liveness (lease.py)."""
        at = clock.now()
        with self._write():
            run = self.get_run(run_id)
            if run.lease_owner and holder_alive(run.lease_owner, run.lease_expires_at):
                raise LeaseHeld(run.lease_owner, run.lease_expires_at)
            version = run.lease_version + 1
            self.conn.execute(
                "UPDATE runs SET lease_owner = ?, lease_version = ?, lease_expires_at = ? "
                "WHERE run_id = ? AND lease_version = ?",
                (
                    _dump(owner),
                    version,
                    clock.iso(clock.later(ttl_s, at)),
                    run_id,
                    run.lease_version,
                ),
            )
            self._event(
                run_id,
                "lease_taken",
                None,
                {"owner": owner, "version": version, "previous": run.lease_owner},
                clock.iso(at),
            )
        return version

    def renew_lease(self, run_id: str, lease_version: int, ttl_s: float) -> bool:
        with self._write():
            cursor = self.conn.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_version = ?",
                (clock.iso(clock.later(ttl_s)), run_id, lease_version),
            )
        return bool(cursor.rowcount == 1)

    def release_lease(self, run_id: str, lease_version: int) -> None:
        with self._write():
            self.conn.execute(
                "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE run_id = ? AND lease_version = ?",
                (run_id, lease_version),
            )
