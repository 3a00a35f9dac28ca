"""A worker frozen between point A and its send (SIGSTOP, a paused container) must not
send after it lost its lease, and says truly why it stopped; a heartbeat never dies
silently, never renews a lease its process has learned it lost, and a lease whose heartbeat
stalled is no longer surely held from two thirds of its TTL on."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from notifier.domain import clock
from notifier.engine import membership as lease_module
from notifier.sandbox.server import Faults, Sandbox
from notifier.store import StorageFailed, Store
from notifier.store.leases import Leases

from ..conftest import Workspace, make_rows, postgres_schema, wait_for
from ..engine.test_store_integrity import planned_store
from ..receiver import Receiver, receiving, released, webhook_config
from ..support.background import meanwhile
from ..support.workspace import stopped

UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"


def _unshare_works() -> bool:
    try:
        probe = subprocess.run(
            [UNSHARE, "--uts", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.both_stores
@pytest.mark.skipif(
    not _unshare_works(),
    reason="needs `unshare --uts` (root) to run the second worker under another host name: "
    "on the same host a live, frozen pid blocks the takeover by design",
)
def test_thawed_worker_does_not_send_after_another_took_over(ws: Workspace) -> None:
    """Worker A freezes after point A of item 5; B (another host) takes over when the 2 s
    lease expires, settles item 5 by query and completes; thawed A sends nothing, exits 4:
    the non-idempotent receiver holds each key exactly once."""
    with Sandbox(faults=Faults(idempotent=False)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 2\n\n"
            "[channels.hooks]\n"
            'type = "webhook"\n'
            f'url = "{sandbox.url}/notifications"\n'
            f'status_url = "{sandbox.url}/notifications/{{key}}"\n'
            "idempotent = false\n"
            "timeout = 2\n"
        )
        ws.write_csv("batch.csv", make_rows(10))
        worker_a = ws.popen(
            "send", "batch.csv", "--channel", "hooks",
            env={"NOTIFIER_FREEZE_AT": "after-intent:5"},
        )  # fmt: skip
        try:

            def frozen() -> bool:
                assert worker_a.poll() is None, worker_a.communicate()
                return stopped(worker_a.pid)

            wait_for(frozen, "worker A froze after point A of item 5")
            deadline = time.monotonic() + 60
            command = [sys.executable, "-m", "notifier", "--db", str(ws.db), "resume"]
            while True:  # A's lease blocks (exit 4) until it expires, 2 s after its last beat
                worker_b = subprocess.run(
                    [UNSHARE, "--uts", "/bin/sh", "-c", 'hostname notifier-b && exec "$@"', "sh",
                     *command],
                    cwd=ws.path, capture_output=True, text=True, timeout=120, check=False,
                )  # fmt: skip
                if worker_b.returncode != 4 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert worker_b.returncode == 0, worker_b.stdout + worker_b.stderr
            assert "item 5" in worker_b.stdout
        finally:
            os.kill(worker_a.pid, signal.SIGCONT)
            out_a, err_a = worker_a.communicate(timeout=120)
        keys = Counter(d["idempotency_key"] for d in sandbox.deliveries())
    assert worker_a.returncode == 4, out_a + err_a
    assert len(keys) == 10 and set(keys.values()) == {1}, keys
    assert ws.ledger.state_counts() == {"sent": 10}


@pytest.mark.both_stores
def test_heartbeat_survives_an_unexpected_error_and_flags_the_lease(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal raising something unexpected does not kill the heartbeat silently: the lease
    is marked lost and surely_valid() turns false, so no send starts on it."""
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv")  # any run will do: the lease is what is tested
    assert sent.exit_code == 0, sent.output
    store = Store.open(ws.db)
    try:
        (run,) = store.core.runs()
        calls = threading.Event()

        def broken_renew(self: Leases, run_id: str, version: int, ttl_s: float) -> bool:
            calls.set()
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(Leases, "renew_lease", broken_renew)
        held = lease_module.SoleLease(store, run.run_id, ttl_s=0.3)
        try:
            assert held.surely_valid()
            wait_for(lambda: held.control.lost, "the heartbeat flagged the lease lost", 10)
            assert calls.is_set()
            assert not held.surely_valid()
        finally:
            held.release()
    finally:
        store.close()


@contextmanager
def _write_lock(ws: Workspace, run_id: str) -> Iterator[None]:
    """Another program holding what a renewal must write, until the block ends: the SQLite
    file's write lock, or the run's row on PostgreSQL."""
    if ws.url:
        with psycopg.connect(ws.url) as pg:
            pg.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
            yield
            pg.rollback()
        return
    conn = sqlite3.connect(ws.db_file, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@pytest.mark.both_stores
@pytest.mark.timeout(90)
def test_heartbeat_outlasts_a_database_locked_past_its_lock_timeout(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that waits out the lock timeout reaches the lease as the store's
    StorageFailed (no engine error): the heartbeat keeps the lease and renews it once the
    lock goes."""
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv")  # any run will do: the lease is what is tested
    assert sent.exit_code == 0, sent.output
    outcomes: list[object] = []  # what each renewal returned or raised, in order
    renew = Leases.renew_lease

    def watched_renew(self: Leases, run_id: str, version: int, ttl_s: float) -> Any:
        try:
            renewed = renew(self, run_id, version, ttl_s)
        except Exception as exc:
            outcomes.append(exc)
            raise
        outcomes.append(renewed)
        return renewed

    monkeypatch.setattr(Leases, "renew_lease", watched_renew)
    store = Store.open(ws.db)
    try:
        (run,) = store.core.runs()
        held = lease_module.SoleLease(store, run.run_id, ttl_s=3)
        try:
            with _write_lock(ws, run.run_id):
                wait_for(
                    lambda: any(isinstance(o, Exception) for o in outcomes),
                    "a renewal that waited out the lock timeout",
                )
                failures = [o for o in outcomes if isinstance(o, Exception)]
                assert all(isinstance(o, StorageFailed) for o in failures), failures
                assert not held.control.lost
            after = len(outcomes)
            wait_for(
                lambda: True in outcomes[after:] and held.surely_valid(),
                "a renewal once the lock went",
            )
            assert not held.control.lost
        finally:
            held.release()
    finally:
        store.close()


def _stale(db: str, worker_id: str) -> bool:
    """Whether the worker's lease has expired by its own record (not renewed for ttl)."""
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT expires_at FROM workers WHERE worker_id = %s", (worker_id,))
        (expires_at,) = row.fetchone() or (None,)
    return expires_at is not None and clock.parse(expires_at) < clock.now()


# A worker lease's release (RELEASE_WORKER), as pg_stat_activity shows it.
_RELEASING = "UPDATE workers SET state = 'released'%"


def _waiting_for(db: str, holder: psycopg.Connection[Any], query_like: str = "%") -> int:
    """How many sessions, inside a transaction, wait for a lock `holder`'s session holds,
    their statement LIKE `query_like`. Read on a connection of its own: a transaction sees
    the sessions' activity as it was at its first look (PostgreSQL keeps it till its end)."""
    with psycopg.connect(db, autocommit=True) as look:
        row = look.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)) "
            "AND xact_start IS NOT NULL AND query LIKE %s",
            (holder.info.backend_pid, query_like),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.timeout(90)
def test_a_worker_thawed_after_its_lease_went_stale_says_so_and_never_renews(
    postgres_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `send` on PostgreSQL (N = 1) freezes after point A of item 5 and stays stopped
    until its 2 s lease has expired; nobody takes the run over. Thawed while its lease row
    is locked here (so no renewal can land before its sender looks), it sends nothing,
    exits 4 saying its lease went stale (not that another process took over), and leaves
    its lease released, not renewed: a `resume` then goes on at once and completes the
    run, every key committed once."""
    receiver = Receiver()
    with (
        postgres_schema(postgres_server) as url,
        receiving(receiver),
        closing(Workspace(tmp_path, url=url)) as ws,
    ):
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 2\n\n" + webhook_config(receiver, idempotent=False, status=True)
        )
        ws.write_csv("batch.csv", make_rows(10))
        sender = ws.popen(
            "send", "batch.csv", "--channel", "hooks",
            env={"NOTIFIER_FREEZE_AT": "after-intent:5"},
        )  # fmt: skip
        with released([sender]):
            wait_for(lambda: stopped(sender.pid), "the sender froze")
            (worker_id,) = [w["worker_id"] for w in ws.ledger.workers()]
            wait_for(lambda: _stale(url, worker_id), "its lease expired", timeout=30)
            with psycopg.connect(url) as holder:
                holder.execute("SELECT 1 FROM workers WHERE worker_id = %s FOR UPDATE",
                               (worker_id,))  # fmt: skip
                os.kill(sender.pid, signal.SIGCONT)
                # Its release waits here, so its sender has looked at the lease and ended
                # the run (the process exits first where nothing is released).
                wait_for(
                    lambda: sender.poll() is not None or _waiting_for(url, holder, _RELEASING) >= 1,
                    "the thawed sender stopped",
                    timeout=30,
                )
                holder.rollback()
            out, err = sender.communicate(timeout=30)
        assert sender.returncode == 4, out + err
        assert "its lease went stale while this process was not running" in err, err
        assert "took over" not in err, err
        assert [w["state"] for w in ws.ledger.workers()] == ["released"]
        assert len(receiver.commits) == 4, "item 5 was not sent"
        monkeypatch.chdir(tmp_path)  # resume in-process reads this notifier.toml
        resumed = ws.invoke("resume")
        assert resumed.exit_code == 0, resumed.output
    assert len(receiver.commits) == 10
    assert set(receiver.commits.values()) == {1}


@pytest.mark.timeout(60)
def test_a_heartbeat_never_waits_behind_its_own_committer(
    postgres_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `send` on PostgreSQL whose committer waits, inside its transaction (its fence on
    its lease row held), for the run's row, held here: its heartbeat still renews the
    lease meanwhile (it writes no key of that row), so the lease stays surely valid for
    as long as the committer waits; let go, the run completes."""
    receiver = Receiver(commit_delay_s=0.05)  # the run lasts seconds
    with (
        postgres_schema(postgres_server) as url,
        receiving(receiver),
        closing(Workspace(tmp_path, url=url)) as ws,
    ):
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 3\n\n" + webhook_config(receiver, idempotent=False, status=True)
        )
        ws.write_csv("batch.csv", make_rows(200))
        monkeypatch.chdir(tmp_path)  # the send in-process reads this notifier.toml

        def hold_the_runs_row() -> None:
            wait_for(lambda: len(receiver.commits) >= 5, "5 sent")
            with psycopg.connect(url) as holder:
                holder.execute("SELECT 1 FROM runs WHERE run_id = 'h1' FOR UPDATE")
                wait_for(lambda: _waiting_for(url, holder) >= 1, "the committer waits", timeout=8)
                (waited_from,) = [w["heartbeat_at"] for w in ws.ledger.workers()]
                wait_for(
                    lambda: ws.ledger.workers()[0]["heartbeat_at"] > waited_from,
                    "a renewal while the committer waits",
                    timeout=5,  # within the lock timeout (10 s): the committer still waits
                )
                assert _waiting_for(url, holder) >= 1, "the committer waited throughout"
                holder.rollback()

        # The send in-process (its heartbeat a thread of its own, as in a process), the
        # run's row held from another thread while it sends.
        with meanwhile(hold_the_runs_row):
            sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "h1")
        assert sent.exit_code == 0, sent.output
    assert len(receiver.commits) == 200


class _FakeMonotonic:
    """The lease module's monotonic clock, moved by the test alone."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.both_stores
def test_a_lease_whose_heartbeat_stalled_is_not_surely_ours_after_two_thirds_of_its_ttl(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease whose heartbeat stalled is no longer surely ours from 2/3 of its TTL on."""
    ttl = 0.3  # real seconds only for the heartbeat's period (ttl / 3) and the stored expiry
    fake = _FakeMonotonic()
    monkeypatch.setattr(lease_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    entered, unblock = threading.Event(), threading.Event()

    def stuck_renewal(*args: Any, **kwargs: Any) -> bool:
        entered.set()
        unblock.wait(60)  # until the test lets go (it always does, in its finally)
        return True

    monkeypatch.setattr(Leases, "renew_lease", stuck_renewal)
    store = planned_store(ws.db, 1)
    try:
        held = lease_module.SoleLease(store, "r1", ttl_s=ttl)
        try:
            assert entered.wait(30), "the heartbeat never tried to renew"
            assert not held.control.lost
            for fraction, surely in ((0.0, True), (0.5, True), (0.66, True),
                                     (0.67, False), (0.9, False), (1.5, False)):  # fmt: skip
                fake.now = 1000.0 + fraction * ttl
                assert held.surely_valid() is surely, f"at {fraction:.2f} of the TTL"
        finally:
            unblock.set()
            held.release()
    finally:
        store.close()
