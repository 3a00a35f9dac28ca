"""Many workers on one PostgreSQL run: worker leases, adoption of what a dead
worker left, cancel, the shared --rate bucket, status, and m005 on both engines. Every
worker is a real `notifier` process against a real PostgreSQL server and the sandbox."""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from notifier.cli import cli as cli_group
from notifier.domain import clock
from notifier.engine.membership import holder_alive
from notifier.sandbox.server import Faults, Sandbox
from notifier.store import LeaseLost, Store

from ..conftest import ROOT, Workspace, default_sigint, make_rows, postgres_schema, wait_for
from ..receiver import WAIT_S, Receiver, receiving, released, webhook_config
from ..support.ledger import Ledger
from ..support.workspace import stopped
from .test_frozen_worker import UNSHARE, _stale, _unshare_works, _waiting_for

FIXTURES = ROOT / "tests" / "fixtures"
FAST_RETRY = "[retry]\nmax_attempts = 20\nbackoff_base = 0.02\nbackoff_max = 0.2\n"


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    """A schema of its own on the tests' PostgreSQL server (see conftest)."""
    with postgres_schema(postgres_server) as url:
        yield url


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    faults = getattr(request, "param", Faults())
    with Sandbox(faults=faults) as running:
        yield running


def configure(ws: Workspace, sandbox: Sandbox, *, rate: float | None = None) -> None:
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "{sandbox.notifications_url}"',
        f'status_url = "{sandbox.url}/notifications/{{key}}"',
        "idempotent = true",
        "timeout = 5",
        "query_delay = 0.2",
    ]
    if rate is not None:
        lines.append(f"rate = {rate}")
    (ws.path / "notifier.toml").write_text("\n".join(lines) + "\n" + FAST_RETRY)


def notifier(ws: Workspace, db: str, *args: str) -> subprocess.Popen[str]:
    """`NOTIFIER_DB=DB notifier ARGS` as a real process in the workspace (the database from
    the environment, as the workspace gives it: the advice it prints reads as in a shell)."""
    return subprocess.Popen(
        [sys.executable, "-m", "notifier", *args],
        cwd=ws.path,
        env={**os.environ, "NOTIFIER_DB": db},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,  # noqa: PLW1509 (a test's Ctrl-C must reach it)
    )


def wait_for_run(db: str, run_id: str, timeout: float = 30) -> None:
    """Until the first process has stored the plan: a worker joins an existing run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if rows(db, "SELECT 1 FROM runs WHERE run_id = ?", (run_id,)):
                return
        except psycopg.errors.UndefinedTable:
            pass
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} was never planned")


def fleet(ws: Workspace, db: str, run_id: str, size: int, concurrency: int) -> list[Any]:
    """`send` plans batch.csv as `run_id` and sends; once the plan is stored, `size - 1`
    workers join it."""
    first = notifier(ws, db, "send", "batch.csv", "--channel", "hooks", "--run-id", run_id,
                     "--concurrency", str(concurrency))  # fmt: skip
    wait_for_run(db, run_id)
    others = [
        notifier(ws, db, "worker", run_id, "--concurrency", str(concurrency))
        for _ in range(size - 1)
    ]
    return [first, *others]


def finish(process: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def finish_fleet(processes: list[subprocess.Popen[str]], run_id: str) -> None:
    """Every worker of a run that completed ended as the contract says: the one that closed
    the run exits 0, and each that left the run to workers still sending it exits 3
    ("stopped, not done"), saying so and naming `notifier status RUN_ID`."""
    ended = [finish(process) for process in processes]
    assert 0 in [code for code, _ in ended], ended
    for code, out in ended:
        assert code in (0, 3), out
        if code == 3:
            assert "still being sent by the other live workers" in out, out
            assert f"`notifier status {run_id}`" in out, out


def cli(db: str, *args: str) -> tuple[int, str]:
    """`NOTIFIER_DB=DB notifier ARGS` in-process (the test's directory is the workspace), for a
    command that contends with no worker for the run: its exit code and its output."""
    result = CliRunner().invoke(
        cli_group, list(args), env={"NOTIFIER_DB": db}, catch_exceptions=False
    )
    return result.exit_code, result.output


def ledger(db: str) -> Ledger:
    """The typed read model (support/ledger.py) of the schema `db` names."""
    return Ledger(lambda sql, params: rows(db, sql, tuple(params)))


def rows(db: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(db) as conn:
        return [tuple(r) for r in conn.execute(sql.replace("?", "%s"), params)]


def report(ws: Workspace, db: str) -> dict[str, Any]:
    code, out = cli(db, "report", "--format", "json")
    assert code == 0, out
    data: dict[str, Any] = json.loads(out)
    return data


def commits(sandbox: Sandbox) -> dict[str, int]:
    return {k: v["commits"] for k, v in sandbox.stats()["keys"].items()}


def has_sent(db: str, run_id: str, at_least: int) -> bool:
    return ledger(db).state_counts(run_id).get("sent", 0) >= at_least


def live_pids(db: str, run_id: str) -> set[int]:
    return set(ledger(db).live_worker_pids(run_id))


def holders(db: str, run_id: str) -> set[str]:
    """The workers holding at least one item of `run_id` in flight."""
    return {str(item.worker_id) for item in ledger(db).items(run_id) if item.state == "in_flight"}


def test_worker_on_an_sqlite_file_is_refused_with_the_reason(ws: Workspace) -> None:
    """`notifier worker` needs PostgreSQL: on an SQLite file it exits 2 naming `resume`."""
    ws.write_csv("batch.csv", make_rows(3))
    result = ws.invoke("worker")
    assert result.exit_code == 2
    assert "notifier resume" in result.output
    assert "Traceback" not in result.output


def test_an_m004_sqlite_database_gains_workers_and_resumes(ws: Workspace) -> None:
    """A database written before m005 (item 8 in flight, its file written) is migrated and
    resumed: item 8 is found by query, the rest sent, each of the 20 files once."""
    shutil.copy(FIXTURES / "m005-inflight-run.db", ws.db_file)
    shutil.copytree(FIXTURES / "m005-inflight-run.outbox", ws.outbox)
    result = ws.invoke("resume", "m005-fixture")
    assert result.exit_code == 0, result.output
    assert "7 sent, 1 in flight, 0 unknown, 0 failed, 12 pending" in result.output
    assert "m005_workers" in ws.ledger.migrations()
    documents = ws.outbox_documents()
    assert len(documents) == 20
    assert len({d["idempotency_key"] for d in documents}) == 20
    assert ws.ledger.state_counts() == {"sent": 20}


def test_an_m004_postgres_database_gains_workers_and_resumes(ws: Workspace, pg_url: str) -> None:
    """The same on PostgreSQL: a schema dumped before m005 is migrated and resumed, and
    every key of the run is written to the outbox exactly once."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute((FIXTURES / "m005-inflight-run-pg.sql").read_text().encode())
    shutil.copytree(FIXTURES / "m005-inflight-run-pg.outbox", ws.outbox)
    code, out = cli(pg_url, "resume", "m005-fixture")
    assert code == 0, out
    assert "7 sent, 1 in flight, 0 unknown, 0 failed, 12 pending" in out
    assert ("m005_workers",) in rows(pg_url, "SELECT name FROM notifier_migrations")
    documents = ws.outbox_documents()
    assert len(documents) == 20
    assert len({d["idempotency_key"] for d in documents}) == 20
    assert ledger(pg_url).state_counts() == {"sent": 20}


@pytest.mark.parametrize(
    "sandbox",
    [
        Faults(
            seed=11,
            latency_ms=30,
            throttle_rate=0.03,
            retry_after=1,
            error_rate=0.05,
            drop_rate=0.05,
        )
    ],
    indirect=True,
)
@pytest.mark.slow
def test_chaos_three_workers_killed_at_random_each_key_committed_once(
    ws: Workspace, pg_url: str, sandbox: Sandbox, fast_waits: float
) -> None:
    """Three workers on one run, SIGKILLed at 8 random points of its progress and replaced,
    against a sandbox that throttles, fails and drops: every key is committed exactly once,
    the report says `sent` for exactly the keys the sandbox holds, and `verify` replays the
    run's chain to exactly its rows."""
    configure(ws, sandbox)
    ws.write_csv("batch.csv", make_rows(400))
    rng = random.Random(7)
    run_id = "chaos"
    workers = fleet(ws, pg_url, run_id, 3, 6)
    kills = 0
    # The kills land at random points of the run's progress, not at random times (a fast run
    # could finish before them): each after a drawn number of the first 300 items is sent,
    # so at least 100 items remain to be sent with every kill.
    for mark in sorted(rng.sample(range(10, 300), 8)):
        wait_for(functools.partial(has_sent, pg_url, run_id, mark), f"{mark} items sent")
        running = [w for w in workers if w.poll() is None]
        assert running, "every worker exited with items left to send"
        victim = rng.choice(running)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        while sum(w.poll() is None for w in workers) < 3:
            workers.append(notifier(ws, pg_url, "worker", run_id, "--concurrency", "6"))
    for worker in workers:
        if worker.poll() is None:
            finish(worker, timeout=60)
    # Whatever the last kill left behind, one more worker settles it and finishes the run
    # (in-process: every other worker has ended).
    code, out = cli(pg_url, "worker", run_id)
    assert code == 0, out
    assert kills == 8
    data = report(ws, pg_url)
    assert data["state"] == "completed"
    sent = {item["idempotency_key"] for item in data["items"] if item["state"] == "sent"}
    assert len(sent) == 400
    counted = commits(sandbox)
    assert set(counted) == sent
    assert set(counted.values()) == {1}
    # The chain the workers wrote, each killed at random, replays to exactly the rows stored.
    code, out = cli(pg_url, "verify", run_id)
    assert code == 0, out
    assert f"run {run_id}: unkeyed" in out, out


@pytest.mark.parametrize("sandbox", [Faults(latency_ms=150)], indirect=True)
def test_cancel_stops_every_worker(ws: Workspace, pg_url: str, sandbox: Sandbox) -> None:
    """`cancel` returns once no request of any worker can start: both workers exit, the run
    is cancelled, and nothing reaches the sandbox after cancel returned."""
    configure(ws, sandbox)
    ws.write_csv("batch.csv", make_rows(300))
    first, second = fleet(ws, pg_url, "c1", 2, 4)
    wait_for(lambda: len(sandbox.deliveries()) >= 20, "20 deliveries")
    code, out = cli(pg_url, "cancel", "c1", "--wait", "30")  # the workers are the processes
    returned = datetime.now(UTC)
    assert code in (0, 3), out
    assert "cancelled" in out
    for worker in (first, second):
        worker_code, worker_out = finish(worker, timeout=30)
        assert worker_code in (0, 3), worker_out
    assert ledger(pg_url).run("c1").state == "cancelled"
    late = [d for d in sandbox.deliveries() if datetime.fromisoformat(d["committed_at"]) > returned]
    assert late == []
    assert ledger(pg_url).live_worker_pids() == []


def test_rate_is_one_bucket_for_all_workers(ws: Workspace, pg_url: str, sandbox: Sandbox) -> None:
    """`rate = 10` on the channel, two workers started together on a planned run: the
    arrivals span what one bucket of 10 per second allows (5 s for 60 items after a burst of
    10); a bucket per worker would let them through in 2 s."""
    configure(ws, sandbox, rate=10)
    ws.write_csv("batch.csv", make_rows(60))
    code, out = cli(
        pg_url, "send", "batch.csv", "--channel", "hooks", "--run-id", "r1", "--require-approval"
    )
    fingerprint = next(line.split()[-1] for line in out.splitlines() if "fingerprint:" in line)
    code, out = cli(pg_url, "approve", "r1", "--fingerprint", fingerprint)
    assert code == 0, out
    workers = [notifier(ws, pg_url, "worker", "r1", "--concurrency", "4") for _ in range(2)]
    finish_fleet(workers, "r1")
    stamps = sorted(datetime.fromisoformat(d["committed_at"]) for d in sandbox.deliveries())
    assert len(stamps) == 60
    assert (stamps[-1] - stamps[0]).total_seconds() >= 4.0


def test_status_shows_the_live_workers(ws: Workspace, pg_url: str) -> None:
    """While two workers send, `status --json` lists both with host, pid and items in flight."""
    # Every answer is held until both statuses are taken: the workers are mid-run however
    # slow the machine (a held request must not time out first, hence the timeout).
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True, timeout=2 * WAIT_S)
        )
        ws.write_csv("batch.csv", make_rows(20))
        first, second = fleet(ws, pg_url, "s1", 2, 2)
        try:
            wait_for(
                lambda: live_pids(pg_url, "s1") == {first.pid, second.pid}, "both workers live"
            )
            receiver.wait_for(lambda r: len(r.arrivals) == 4)  # 2 senders each: both at work
            code, out = cli(pg_url, "status", "s1", "--json")
            assert code == 0, out
            workers = json.loads(out)["workers"]
            assert sorted(w["pid"] for w in workers) == sorted([first.pid, second.pid])
            assert all(w["host"] and w["heartbeat_at"] for w in workers)
            code, table = cli(pg_url, "status", "s1")
            assert f"worker: pid {first.pid}" in table
        finally:
            hold.set()
            for worker in (first, second):
                finish(worker)


def test_a_reaped_worker_writes_nothing(ws: Workspace, pg_url: str) -> None:
    """A worker on another host whose lease expired is fenced out when a live worker adopts
    its in-flight items: its next write (a claim) fails with LeaseLost and changes nothing."""
    ws.write_csv("batch.csv", make_rows(5))
    code, out = cli(pg_url, "send", "batch.csv", "--run-id", "f1", "--require-approval")
    assert code in (0, 3), out
    old, new = Store.open(pg_url), Store.open(pg_url)
    try:
        gone = {"host": "elsewhere-1", "pid": 1, "started": None, "token": "old-worker"}
        old_version = old.leases.join_run("f1", gone, 0.05, holder_alive)
        old = old.for_worker("old-worker")  # shares the connection: closed as `old`
        assert [item.seq for item in old.ledger.claim("f1", old_version, 2)] == [1, 2]
        time.sleep(0.2)  # its lease expires: another host is trusted only until then
        live = {"host": "elsewhere-2", "pid": 2, "started": None, "token": "new-worker"}
        new_version = new.leases.join_run("f1", live, 30, holder_alive)
        new = new.for_worker("new-worker")
        assert new.leases.adopt_orphans("f1", "new-worker", new_version, holder_alive).seqs == [
            1,
            2,
        ]
        with pytest.raises(LeaseLost):
            old.ledger.claim("f1", old_version, 1)
        assert not old.leases.renew_worker("old-worker", old_version, 30)
    finally:
        old.close()
        new.close()
    assert rows(pg_url, "SELECT worker_id, state FROM workers ORDER BY worker_id") == [
        ("new-worker", "live"),
        ("old-worker", "reaped"),
    ]
    assert [(i.seq, i.state, i.worker_id) for i in ledger(pg_url).items() if i.seq <= 3] == [
        (1, "in_flight", "new-worker"),
        (2, "in_flight", "new-worker"),
        (3, "pending", None),
    ]


@pytest.mark.parametrize(
    "sandbox", [Faults(seed=5, latency_ms=20, throttle_rate=0.05, retry_after=3)], indirect=True
)
def test_a_throttled_answer_closes_the_channel_for_every_worker(
    ws: Workspace, pg_url: str, sandbox: Sandbox
) -> None:
    """A 429 with Retry-After 3 s answered to one worker closes the channel for both: after
    a second's grace (the others' next look, 0.2 s, plus their requests already started),
    no worker claims an item on it until the 3 s are over."""
    configure(ws, sandbox)
    ws.write_csv("batch.csv", make_rows(150))
    finish_fleet(fleet(ws, pg_url, "g1", 2, 4), "g1")
    throttled = [
        clock.parse(finished)
        for (finished,) in rows(
            pg_url, "SELECT finished_at FROM attempts WHERE outcome = 'throttled'"
        )
    ]
    assert throttled, "the sandbox throttled nothing: pick another seed"
    started = [
        clock.parse(at)
        for (at,) in rows(
            pg_url,
            "SELECT started_at FROM attempts WHERE outcome IS NULL OR outcome != 'not_started'",
        )
    ]
    for closed in throttled:
        inside = [at for at in started if 1.0 < (at - closed).total_seconds() < 2.9]
        assert inside == [], f"claimed while the channel was closed since {closed}"
    assert set(commits(sandbox).values()) == {1}


def test_ctrl_c_on_one_worker_leaves_the_run_to_the_other(ws: Workspace, pg_url: str) -> None:
    """Ctrl-C on one of two workers: it records what it sent and exits 130, the run stays
    running, and the other worker completes it with each key committed once."""
    # Every answer is held until both workers hold items: on a busy machine one worker
    # could otherwise finish the batch before the other had started. A held request must
    # not time out first (hence the timeout): its retry under the same key would count as
    # a second commit here, where a real idempotent receiver keeps one.
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(
                receiver, idempotent=True, status=True, query_delay=0.2, timeout=2 * WAIT_S
            )
        )
        ws.write_csv("batch.csv", make_rows(120))
        first, second = fleet(ws, pg_url, "i1", 2, 4)
        try:
            # Both are sending: each holds items it claimed (point A committed, handed to
            # its senders).
            wait_for(lambda: len(holders(pg_url, "i1")) == 2, "both workers hold items")
            second.send_signal(signal.SIGINT)
            hold.set()
            code, out = finish(second)
            assert code == 130, out
            assert "left the run to the other workers" in out
            code, out = finish(first)
            assert code == 0, out
        finally:
            hold.set()
            for process in (first, second):
                if process.poll() is None:
                    process.kill()
                    process.communicate()
    assert ledger(pg_url).run().state == "completed"
    assert set(receiver.commits.values()) == {1}
    assert len(receiver.commits) == 120


def test_a_worker_that_leaves_a_run_still_being_sent_exits_3(ws: Workspace, pg_url: str) -> None:
    """Exit 0 means every item was sent. Two workers, each holding items (every answer held
    until both do): the one that finishes its items first, while the other still sends,
    leaves the run to it and exits 3 ("stopped, not done"), naming `notifier status`; the
    other closes the run and exits 0."""
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True, timeout=2 * WAIT_S)
        )
        ws.write_csv("batch.csv", make_rows(60))
        workers = fleet(ws, pg_url, "x1", 2, 4)
        with released(workers, hold):
            wait_for(lambda: len(holders(pg_url, "x1")) == 2, "both workers hold items")
            hold.set()
            ended = sorted(finish(worker) for worker in workers)
    assert [code for code, _ in ended] == [0, 3], ended
    out = ended[1][1]
    assert "still being sent by the other live workers" in out, out
    assert "`notifier status x1`" in out, out
    assert ledger(pg_url).run().state == "completed"
    assert len(receiver.commits) == 60
    assert set(receiver.commits.values()) == {1}


FROZEN_ROWS = 400


def _freeze_inside_a_transaction(
    db: str, process: subprocess.Popen[str], worker_id: str
) -> list[int]:
    """Stop `process` (SIGSTOP) inside one of its write transactions, holding row locks:
    its items in flight are locked here until its committer's write of them waits for
    that lock (inside its transaction), then it is stopped and the lock let go, so that
    write ends on the server while the process can send nothing more. Returns the in-flight
    items locked here (SKIP LOCKED: rows the worker's open transaction holds are left to it,
    as this lock must never wait for the worker; it waiting for this one too would be a
    deadlock, and the server would abort one of the two)."""
    with psycopg.connect(db) as holder:
        while True:
            locked = [
                seq
                for (seq,) in holder.execute(
                    "SELECT seq FROM items WHERE worker_id = %s AND state = 'in_flight' "
                    "ORDER BY seq FOR UPDATE SKIP LOCKED",
                    (worker_id,),
                )
            ]
            if locked:
                break
            holder.rollback()  # its commit moved them meanwhile: lock the next ones
        wait_for(lambda: _waiting_for(db, holder) >= 1, "the worker's write waits")
        process.send_signal(signal.SIGSTOP)
        wait_for(lambda: stopped(process.pid), "the worker is stopped")
        holder.rollback()
    return locked


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare --uts` (root): see below")
@pytest.mark.timeout(110)
@pytest.mark.parametrize("frozen_n", [1, 8])
def test_a_worker_frozen_inside_a_transaction_holds_up_only_its_own_items(
    ws: Workspace, pg_url: str, frozen_n: int
) -> None:
    """Worker B (another host name: on this host a live, stopped pid is alive by design)
    is stopped inside a write transaction holding row locks, its lease ttl 3 s. Worker A
    (N = 8) goes on sending, reaps B once its lease has expired and the server has ended
    its idle transaction, adopts B's items, settles them by query and completes the run,
    exit 0, while B is still stopped; a `resume` started during the freeze never meets a
    lock timeout. Thawed, B exits 4 and never renews its lease (its row stays as the reap
    left it). Every key is committed exactly once."""
    receiver = Receiver(commit_delay_s=0.1)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 3\n\n" + webhook_config(receiver, idempotent=False, status=True)
        )
        ws.write_csv("batch.csv", make_rows(FROZEN_ROWS))
        first = fleet(ws, pg_url, "z1", 1, 8)[0]
        command = [sys.executable, "-m", "notifier", "--db", pg_url, "worker", "z1",
                   "--concurrency", str(frozen_n)]  # fmt: skip
        frozen = subprocess.Popen(
            [UNSHARE, "--uts", "/bin/sh", "-c", 'hostname notifier-b && exec "$@"', "sh",
             *command],
            cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        processes = [first, frozen]
        with released(processes):
            wait_for(lambda: len(holders(pg_url, "z1")) == 2, "both workers hold items")
            ((b_id,),) = rows(pg_url, "SELECT worker_id FROM workers WHERE host = 'notifier-b'")
            b_items = _freeze_inside_a_transaction(pg_url, frozen, b_id)
            processes.append(notifier(ws, pg_url, "resume", "z1"))
            # A and the resume share what is left: the last to finish closes the run (0),
            # the other leaves it to the last (3); neither waits out a lock timeout.
            ended = [finish(process, timeout=90) for process in processes[::2]]
            assert sorted(code for code, _ in ended) in ([0, 0], [0, 3]), ended
            assert not any("locked by another session" in out for _, out in ended), ended
            assert stopped(frozen.pid), "B stayed stopped while the run was completed"
            assert ledger(pg_url).run().state == "completed"
            lease_of_b = (
                "SELECT state, version, heartbeat_at, expires_at FROM workers WHERE worker_id = ?"
            )
            reaped = rows(pg_url, lease_of_b, (b_id,))
            assert reaped[0][0] == "reaped", reaped
            frozen.send_signal(signal.SIGCONT)
            code, out = finish(frozen)
            assert code == 4, out
            assert "another process took over this run" in out, out  # A reaped it: it did
            assert "error ignored" not in out, out  # the driver's own noise, never shown
        assert rows(pg_url, lease_of_b, (b_id,)) == reaped, "B renewed nothing once thawed"
    sent = ledger(pg_url).keys("sent")
    assert len(sent) == FROZEN_ROWS and b_items
    assert len(receiver.commits) == FROZEN_ROWS
    assert set(receiver.commits.values()) == {1}, "every key committed once"


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare --uts` (root)")
@pytest.mark.timeout(110)
def test_cancel_during_a_freeze_inside_a_transaction_meets_no_lock_timeout(
    ws: Workspace, pg_url: str
) -> None:
    """As above, B (N = 8, another host name, ttl 3 s) stopped inside a write transaction
    holding row locks. Once B's lease has expired, `cancel --wait 15` stops A, the last
    live worker, which closes the run only after it has fenced B out (once the server has
    ended B's idle transaction) and settled B's items by query: no lock timeout, the run
    cancelled with nothing left in flight, every key committed recorded sent, none twice.
    Thawed, B exits 4."""
    receiver = Receiver(commit_delay_s=0.1)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 3\n\n" + webhook_config(receiver, idempotent=False, status=True)
        )
        ws.write_csv("batch.csv", make_rows(3 * FROZEN_ROWS))  # A sends all along
        first = fleet(ws, pg_url, "z2", 1, 8)[0]
        command = [sys.executable, "-m", "notifier", "--db", pg_url, "worker", "z2",
                   "--concurrency", "8"]  # fmt: skip
        frozen = subprocess.Popen(
            [UNSHARE, "--uts", "/bin/sh", "-c", 'hostname notifier-b && exec "$@"', "sh",
             *command],
            cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        with released([first, frozen]):
            wait_for(lambda: len(holders(pg_url, "z2")) == 2, "both workers hold items")
            ((b_id,),) = rows(pg_url, "SELECT worker_id FROM workers WHERE host = 'notifier-b'")
            _freeze_inside_a_transaction(pg_url, frozen, b_id)
            wait_for(lambda: _stale(pg_url, b_id), "B's lease expired", timeout=30)
            assert first.poll() is None, "A was still sending"
            code, out = cli(pg_url, "cancel", "z2", "--wait", "15")  # B and A are processes
            assert "locked by another session" not in out, out
            assert code in (0, 3), out
            assert stopped(frozen.pid), "B stayed stopped while the run was cancelled"
            assert ledger(pg_url).run().state == "cancelled"
            code, out = finish(first)
            assert code in (0, 3), out
            frozen.send_signal(signal.SIGCONT)
            code, out = finish(frozen)
            assert code == 4, out
    items = ledger(pg_url).items()
    states = {item.idempotency_key: item.state for item in items}
    unsent = {key: states[key] for key in receiver.commits if states[key] != "sent"}
    assert unsent == {}, "every key committed is recorded sent"
    assert [item.seq for item in items if item.state == "in_flight"] == []
    assert set(receiver.commits.values()) == {1}, "no key committed twice"
