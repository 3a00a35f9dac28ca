"""A lease counts as live to its own process from the moment its row is committed: another
worker (or a command) in the same process that looks at the run in between must not find
it dead, reap it and adopt its items (the lease's holder would then stop, its lease lost,
before it sent anything). Within one process a holder is alive while its token is held."""

from __future__ import annotations

from typing import Any

import pytest

from notifier.engine.membership import LeaseKind, SharedLease, SoleLease, holder_alive
from notifier.store import Store
from notifier.store.leases import Leases

from ..conftest import Workspace, make_rows


def _planned(ws: Workspace) -> None:
    ws.write_csv("batch.csv", make_rows(2))
    result = ws.invoke("send", "batch.csv", "--run-id", "r1", "--require-approval")
    assert result.exit_code in (0, 3), result.output


def _alive_once_taken(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, kind: LeaseKind, method: str
) -> list[bool]:
    """Take a lease of `kind` on run r1 with Leases.`method` wrapped: right after its
    transaction commits, whether the owner it wrote is alive, as another worker of this
    process would ask."""
    _planned(ws)
    seen: list[bool] = []
    taken = getattr(Leases, method)

    def looked_at(self: Leases, run_id: str, owner: dict[str, Any], *args: Any) -> int:
        version: int = taken(self, run_id, owner, *args)
        seen.append(holder_alive(owner, None))
        return version

    monkeypatch.setattr(Leases, method, looked_at)
    store = Store.open(ws.db)
    try:
        with kind(store, "r1", 30.0):
            pass
    finally:
        store.close()
    return seen


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_the_runs_lease_is_live_once_committed(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _alive_once_taken(ws, monkeypatch, SoleLease, "acquire_lease") == [True]


# Only PostgreSQL lets workers share a run (Store.shares_runs).
@pytest.mark.parametrize("ws", ["postgres"], indirect=True)
@pytest.mark.timeout(60)
def test_a_worker_lease_is_live_once_committed(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _alive_once_taken(ws, monkeypatch, SharedLease, "join_run") == [True]


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_lease_that_could_not_be_taken_leaves_no_live_token(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is held before the lease is taken; if taking it fails, the token is given
    up again, so nothing of this process looks alive on its account."""
    _planned(ws)
    owners: list[dict[str, Any]] = []

    def refused(self: Leases, run_id: str, owner: dict[str, Any], *args: Any) -> int:
        owners.append(owner)
        raise RuntimeError("refused")

    monkeypatch.setattr(Leases, "acquire_lease", refused)
    store = Store.open(ws.db)
    try:
        with pytest.raises(RuntimeError, match="refused"):
            SoleLease(store, "r1", 30.0)
    finally:
        store.close()
    assert len(owners) == 1
    assert not holder_alive(owners[0], None)


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_lease_stays_live_until_its_release_is_written(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Released, a holder is still alive to its process while its release is being
    written; afterwards it is not."""
    _planned(ws)
    seen: list[bool] = []
    owners: list[dict[str, Any]] = []
    releasing = Leases.release_lease

    def looked_at(self: Leases, run_id: str, version: int) -> None:
        seen.append(holder_alive(owners[0], None))
        releasing(self, run_id, version)

    monkeypatch.setattr(Leases, "release_lease", looked_at)
    store = Store.open(ws.db)
    try:
        lease = SoleLease(store, "r1", 30.0)
        owners.append(lease.owner)
        lease.release()
    finally:
        store.close()
    assert seen == [True]
    assert not holder_alive(owners[0], None)
