"""Guards the code has that no other test pins: each test here fails if the guard
it names is removed. Receivers run on 127.0.0.1 only; nothing waits on a sleep."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
from psycopg.pq import TransactionStatus

from notifier import approval as approval_module
from notifier import clock
from notifier import lease as lease_module
from notifier.brakes import Brakes
from notifier.channels import ChannelError, ErrorKind, Receipt
from notifier.judging import NotStarted, Progress, Stop
from notifier.records import AttemptOutcome, Outcome, Run
from notifier.runner import RunOptions
from notifier.sandbox import Faults, Sandbox
from notifier.state_machine import ItemTrigger
from notifier.store import LostRace, Store
from notifier.store.engine import Engine
from notifier.store.leases import Leases
from notifier.store.postgres import PostgresEngine
from notifier.store.sqlite import SqliteEngine

from .conftest import Workspace, make_rows, wait_for
from .support.held import WAIT_S, Answered, HeldRun

FOREIGN_DIGEST = "sha256:" + "f" * 64


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """The repo's sandbox receiver on 127.0.0.1, with the faults a test parametrises."""
    faults = getattr(request, "param", Faults())
    with Sandbox(faults=faults) as running:
        yield running


def webhook_config(ws: Workspace, sandbox: Sandbox, *, status: bool, max_attempts: int) -> None:
    """A `hooks` channel to the sandbox that dedupes by key, asked by key only with `status`."""
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "{sandbox.notifications_url}"',
        "idempotent = true",
        "timeout = 5",
    ]
    if status:
        lines.append(f'status_url = "{sandbox.url}/notifications/{{key}}"')
    lines += ["[retry]", f"max_attempts = {max_attempts}", "backoff_base = 0.01",
              "backoff_max = 0.05"]  # fmt: skip
    (ws.path / "notifier.toml").write_text("\n".join(lines) + "\n")


def post_foreign_delivery(sandbox: Sandbox, key: str) -> None:
    """Another sender's notification under `key` (another payload, another digest)."""
    parts = urlsplit(sandbox.url)
    assert parts.hostname == "127.0.0.1" and parts.port is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        body = json.dumps({"to": "someone-else@example.com", "body": "not ours"})
        conn.request("POST", "/notifications", body=body, headers={
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "Notifier-Intent-Digest": FOREIGN_DIGEST,
        })  # fmt: skip
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 201, answer.status
    finally:
        conn.close()


# ------------------------------------------------------------ 1. a query finding another digest


@pytest.mark.both_stores
def test_status_query_answering_another_digest_is_a_conflict(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """A status query answering 200 with another digest is a conflict: exit 4, no receipt."""
    webhook_config(ws, sandbox, status=True, max_attempts=3)
    ws.write_csv("batch.csv", make_rows(2))
    crashed = ws.run("send", "batch.csv", "--channel", "hooks", "--concurrency", "1",
                     env={"NOTIFIER_CRASH_AT": "after-intent:1"})  # fmt: skip
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    ((key, state),) = ws.query("SELECT idempotency_key, state FROM items WHERE seq = 1")
    assert state == "in_flight"
    # The receiver holds another intent under item 1's key (a reused run id, another database).
    post_foreign_delivery(sandbox, key)

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 4, resumed.output
    assert "CONFLICT" in resumed.output and FOREIGN_DIGEST in resumed.output
    ((state, receipt_id, last_error),) = ws.query(
        "SELECT state, receipt_id, last_error FROM items WHERE seq = 1"
    )
    assert state == "failed" and receipt_id is None
    assert "conflict" in last_error
    assert ws.query("SELECT COUNT(*) FROM receipts") == [(0,)]
    assert ws.query("SELECT COUNT(*) FROM items WHERE state = 'sent'") == [(0,)]
    assert ws.query("SELECT state FROM runs") == [("halted",)]
    # Only the foreign POST ever reached the receiver: nothing of ours was sent over it.
    assert sandbox.stats()["totals"]["requests"] == 1
    assert sandbox.stats()["keys"][key] == {"commits": 1, "replays": 0, "refused": 0}


# ------------------------------------------------------------ 2. a claim that lost a race


def planned_store(db: Path | str, items: int) -> Store:
    """A new store holding run r1, planned with `items` outbox items (keys k1, k2, …)."""
    store = Store.open(db, create=True)
    store.plans.create_run(
        {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(),
         "batch_path": "b.csv", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {}, "options": {}, "contract_version": "v1"},
        [{"run_id": "r1", "seq": n, "item_id": str(n), "channel": "outbox", "target": "a@b.c",
          "payload": {}, "idempotency_key": f"k{n}", "intent_digest": "sha256:d"}
         for n in range(1, items + 1)],
    )  # fmt: skip
    return store


class _Rows:
    """The rows a claim's SELECT returned, handed back as its cursor would."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


class _MovesOneAfterTheClaimReads:
    """An engine's execute under which, right after a claim has read its pending items and
    before its conditional UPDATE, one of them is moved out of `pending` (as another writer
    moving it between the two statements would leave it). Once only."""

    def __init__(self, engine: Engine, seq: int) -> None:
        self._execute = engine.execute
        self._seq = seq
        self.fired = False

    def __call__(self, statement: str, params: Any = None) -> Any:
        cursor = self._execute(statement, params)
        if self.fired or not (
            statement.startswith("SELECT *") and " FROM items WHERE " in statement
        ):
            return cursor
        self.fired = True
        rows = cursor.fetchall()
        assert self._seq in [row.seq for row in rows]
        self._execute(
            "UPDATE items SET state = 'expired' WHERE run_id = 'r1' AND seq = %(seq)s",
            {"seq": self._seq},
        )
        return _Rows(rows)


def _in_transaction(engine: Engine) -> bool:
    """Whether the engine's connection is inside a transaction, asked of its driver."""
    if isinstance(engine, PostgresEngine):
        return engine.raw.info.transaction_status != TransactionStatus.IDLE
    assert isinstance(engine, SqliteEngine)
    return bool(engine.conn.in_transaction)


def _ledger(ws: Workspace) -> dict[str, list[tuple[Any, ...]]]:
    """Every row a claim could write, read over a connection of its own."""
    return {
        "items": ws.query(
            "SELECT seq, state, attempts, next_attempt_at, worker_id, updated_at FROM items "
            "ORDER BY seq"
        ),
        "attempts": ws.query("SELECT seq, n, started_at FROM attempts ORDER BY seq, n"),
        "events": ws.query("SELECT seq_no, kind, item_seq FROM events ORDER BY seq_no"),
        "run_counts": ws.query("SELECT state, n FROM run_counts ORDER BY state"),
    }


@pytest.mark.both_stores
def test_a_claim_whose_update_moves_fewer_rows_than_it_read_raises_and_writes_nothing(
    ws: Workspace,
) -> None:
    """A claim moving fewer rows than it selected raises LostRace and writes nothing."""
    store = planned_store(ws.db, 3)
    try:
        version = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, lambda o, e: False)
        before = _ledger(ws)
        assert before["items"] and all(row[1] == "pending" for row in before["items"])
        racing = _MovesOneAfterTheClaimReads(store.engine, seq=2)
        store.engine.execute = racing  # type: ignore[method-assign]
        with pytest.raises(LostRace, match="expected 3 items pending for start"):
            store.ledger.claim("r1", version, 3)
        assert racing.fired
        del store.engine.execute  # the engine's own again
        assert not _in_transaction(store.engine)
        assert _ledger(ws) == before
        # The store is still usable: a claim nobody races moves all three.
        assert [i.seq for i in store.ledger.claim("r1", version, 3)] == [1, 2, 3]
    finally:
        store.close()


# ------------------------------------------------------------ 3. a short file with a -wal


def _short_file_beside_a_wal_that_does_not_repair_it(ws: Workspace) -> None:
    """A planned run's file cut short by its last two pages (item rows), beside a -wal
    holding a real commit of that database that does not hold those pages."""
    rows = [["id", "to", "subject", "body"]]
    rows += [[f"u{i}", f"u{i}@example.com", "s" * 50, "b" * 1500] for i in range(1, 301)]
    batch = ws.write_csv("big.csv", rows)
    planned = ws.invoke("send", str(batch), "--require-approval")
    assert planned.exit_code == 0, planned.output
    wal = ws.path / "receipts.db-wal"
    assert not wal.exists()  # the last connection checkpointed: one self-contained file
    # A commit that touches page 1 only, made on a copy and kept in its log.
    aside = ws.path / "aside"
    aside.mkdir()
    (aside / "receipts.db").write_bytes(ws.db_file.read_bytes())
    conn = sqlite3.connect(aside / "receipts.db", isolation_level=None)
    try:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("PRAGMA user_version = 7")
        log = (aside / "receipts.db-wal").read_bytes()
    finally:
        conn.close()
    assert log
    data = ws.db_file.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    ws.db_file.write_bytes(data[: len(data) - 2 * page_size])
    wal.write_bytes(log)
    # On a copy of the pair: SQLite reads the log (its commit shows), and the file stays damaged.
    probe = ws.path / "probe"
    probe.mkdir()
    for name in (ws.db_file.name, wal.name):
        (probe / name).write_bytes((ws.path / name).read_bytes())
    conn = sqlite3.connect(f"file:{probe / ws.db_file.name}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (7,)
        try:
            checked = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as exc:
            checked = [str(exc)]
    finally:
        conn.close()
    assert checked != ["ok"], "this -wal repairs the file: the scenario needs one that does not"


def _fingerprint(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "--json"], ["report", "--format", "json"], ["runs"],
     ["resume"], ["send", "other.csv"]],
    ids=" ".join,
)  # fmt: skip
def test_a_short_file_beside_a_wal_that_does_not_repair_it_is_refused_untouched(
    ws: Workspace, args: list[str]
) -> None:
    """A short database whose -wal does not repair it is refused (exit 4), bytes unchanged."""
    _short_file_beside_a_wal_that_does_not_repair_it(ws)
    ws.write_csv("other.csv", make_rows(3))
    wal = ws.path / "receipts.db-wal"
    before = (ws.db_file.read_bytes(), wal.read_bytes())
    try:
        result = ws.invoke(*args)
        assert result.exit_code == 4, result.output
        assert str(ws.db) in result.output and "Traceback" not in result.output
        after = (ws.db_file.read_bytes(), wal.read_bytes() if wal.exists() else None)
        assert _fingerprint(after[0]) == _fingerprint(before[0]), "the database was changed"
        assert after[1] == before[1], "the -wal was changed or removed"
    finally:
        ws.reset()  # a damaged file on purpose: nothing for the counters check to read


# ------------------------------------------------------------ 4. an approval against a stale state


def _plan_for_approval(ws: Workspace) -> tuple[str, str]:
    batch = ws.write_csv("b.csv", make_rows(4))
    result = ws.invoke("send", str(batch), "--require-approval")
    assert result.exit_code == 0, result.output
    run_id = re.search(r"planned run (\S+):", result.output)
    fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", result.output)
    assert run_id and fingerprint, result.output
    return run_id.group(1), fingerprint.group(1)


@pytest.mark.both_stores
def test_an_approval_bound_to_a_stale_state_version_is_refused(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approval recorded against a stale state version is refused (exit 4), nothing kept."""
    run_id, fingerprint = _plan_for_approval(ws)
    original = approval_module.recompute_fingerprint
    competing: list[subprocess.CompletedProcess[str]] = []

    def then_another_operator_approves(store: Store, run: Run) -> str:
        # Between alice's read of the state version and her record: bob's approval lands.
        actual = original(store, run)
        if not competing:
            competing.append(
                ws.run("approve", run_id, "--fingerprint", fingerprint, env={"USER": "bob"})
            )
        return actual

    monkeypatch.setattr(approval_module, "recompute_fingerprint", then_another_operator_approves)
    stale = ws.invoke("approve", run_id, "--fingerprint", fingerprint, env={"USER": "alice"})
    monkeypatch.setattr(approval_module, "recompute_fingerprint", original)

    (bob,) = competing
    assert bob.returncode == 0, bob.stdout + bob.stderr
    assert stale.exit_code == 4, stale.output
    assert "changed while it was being approved" in stale.output
    ((state, raw),) = ws.query("SELECT state, approval FROM runs")
    record = json.loads(raw)
    assert state == "approved" and record["operator"] == "bob"
    kinds = [kind for (kind,) in ws.query("SELECT kind FROM events WHERE kind LIKE '%approv%'")]
    assert sorted(kinds) == ["run_approve", "run_request_approval"]
    # Bob's approval is intact: the run sends on it.
    sent = ws.invoke("resume")
    assert sent.exit_code == 0, sent.output
    assert ws.query("SELECT COUNT(*) FROM items WHERE state = 'sent'") == [(4,)]


# ------------------------------------------------------------ 5. a stalled heartbeat


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
            assert not held.lost.is_set()
            for fraction, surely in ((0.0, True), (0.5, True), (0.66, True),
                                     (0.67, False), (0.9, False), (1.5, False)):  # fmt: skip
                fake.now = 1000.0 + fraction * ttl
                assert held.surely_valid() is surely, f"at {fraction:.2f} of the TTL"
        finally:
            unblock.set()
            held.release()
    finally:
        store.close()


# ------------------------------------------------------------ 6. 500s on a channel that dedupes


@pytest.mark.both_stores
@pytest.mark.parametrize("sandbox", [Faults(error_rate=1.0)], indirect=True)
def test_an_idempotent_webhook_without_status_url_answering_500_until_attempts_run_out_is_unknown(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """An idempotent webhook without status_url, 500 until attempts run out: unknown, not failed."""
    webhook_config(ws, sandbox, status=False, max_attempts=3)
    ws.write_csv("batch.csv", make_rows(2))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert result.exit_code == 3, result.output
    items = ws.query("SELECT seq, state, attempts, last_error FROM items ORDER BY seq")
    assert [(seq, state, attempts) for seq, state, attempts, _ in items] == [
        (1, "unknown", 3),
        (2, "unknown", 3),
    ]
    assert all("may have been delivered" in error for *_, error in items)
    assert ws.query(
        "SELECT seq, COUNT(*), MIN(http_status), MAX(http_status) FROM attempts GROUP BY seq "
        "ORDER BY seq"
    ) == [(1, 3, 500, 500), (2, 3, 500, 500)]
    assert ws.query("SELECT COUNT(*) FROM receipts") == [(0,)]
    assert sandbox.stats()["totals"]["requests"] == 6
    assert ws.status()["counts"]["failed"] == 0


# ------------------------------------------------------------ 7-9. the senders' last checks
#
# Each runs the real Runner in-process at N = 8 with items claimed ahead, against a channel
# whose requests wait until the test answers them, and holds the committer on the first
# answer it takes up (before judging it) until every queued item has gone through a sender:
# what stops a queued item there is the senders' own check, nothing the committer did.


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_no_item_claimed_ahead_starts_after_its_not_after(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At N = 8 with 3N claimed ahead (a channel that can be asked): the items' not_after
    passes while the first N requests are under way (this process's clock moves two hours
    on); the senders that free up find the 3N queued items past it and start none of
    them: released never attempted, then expired."""
    n = 8
    channel = Answered()
    run = HeldRun(ws, channel, n, 4 * n, not_after=clock.iso(clock.later(3600)))
    run.thread.start()
    try:
        channel.wait_started(n)
        monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))
        passed = time.monotonic()
        channel.let_all_go()
        assert run.held.reached.wait(WAIT_S), "no answer reached the committer"
        run.wait_taken(4 * n)
    finally:
        result = run.finish(channel)
    assert [item for item, at in channel.started if at > passed] == []
    assert len(channel.started) == n
    assert sum(isinstance(r, NotStarted) for r in run.taken) == 3 * n
    assert result.stop is Stop.COMPLETED, result
    assert ws.query("SELECT state, COUNT(*) FROM items GROUP BY state ORDER BY state") == [
        ("expired", 3 * n),
        ("sent", n),
    ]


@pytest.mark.both_stores
@pytest.mark.parametrize(
    ("kind", "stop"), [(ErrorKind.GONE, Stop.HALTED), (ErrorKind.CONFLICT, Stop.CONFLICT)]
)
@pytest.mark.timeout(60)
def test_no_queued_item_starts_after_a_halting_answer(
    ws: Workspace, kind: ErrorKind, stop: Stop
) -> None:
    """At N = 8 with 3N claimed ahead: a 410 (or 422) arrives while the other N - 1
    requests are under way; the senders then free up and find the 3N queued items, the
    committer not having judged the answer yet: no request starts after the halting answer
    was given (every sender was busy when it came, so none had a check passed before it),
    and every queued item is released never attempted."""
    n = 8

    def answer(item: str) -> Receipt | ChannelError:
        if item == "1":
            return ChannelError(kind, f"scripted {kind.value}")
        return Receipt("r-" + item)

    channel = Answered(answer=answer)
    run = HeldRun(ws, channel, n, 4 * n)
    run.thread.start()
    try:
        channel.wait_started(n)
        channel.let_go("1")
        assert run.held.reached.wait(WAIT_S), "the halting answer never reached the committer"
        channel.let_all_go()
        run.wait_taken(4 * n)
    finally:
        result = run.finish(channel)
    halted_at = channel.answered["1"]
    assert [item for item, at in channel.started if at > halted_at] == []
    assert len(channel.started) == n
    assert sum(isinstance(r, NotStarted) for r in run.taken) == 3 * n
    assert result.stop is stop, result
    assert ws.query("SELECT COUNT(*) FROM items WHERE state = 'pending' AND attempts = 0") == [
        (3 * n,)
    ]


def _took_next(run: HeldRun, channel: Answered, n: int, k: int) -> bool:
    """Whether the first `k` answers were taken up, and each of their senders took its next
    job: a start (waiting on the test) or a job held back."""
    return len(run.taken) + len(channel.started) - n >= 2 * k


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_the_uncertain_answers_brake_holds_at_exactly_the_streak_limit(ws: Workspace) -> None:
    """At N = 8 with 3N claimed ahead on a channel that cannot dedupe (its status queries
    find each delivery), the committer held on the first answer: the N requests under way
    answer uncertain one at a time, and each sender that frees up takes a queued item.
    While fewer than the limit (5) answers are uncertain it starts it; at the limit it does
    not. So exactly N + 4 requests leave: one after each of the first four answers, none
    after the fifth and later."""
    n = 8
    channel = Answered(
        idempotent=False,
        holds=True,
        answer=lambda item: ChannelError(ErrorKind.UNCERTAIN, "timed out after sending"),
    )
    run = HeldRun(ws, channel, n, 4 * n)
    run.thread.start()
    try:
        channel.wait_started(n)
        first = [item for item, _ in channel.started[:n]]
        for k, item in enumerate(first, start=1):
            channel.let_go(item)
            wait_for(partial(_took_next, run, channel, n, k), f"sender {k}'s next job", WAIT_S)
        started = len(channel.started)
    finally:
        result = run.finish(channel)
    limit = RunOptions().unknown_streak_limit
    assert limit == 5
    assert started == n + limit - 1
    assert result.stop is Stop.COMPLETED, result  # each query found its delivery


def test_the_committer_halts_at_exactly_the_streak_limit_of_unknowns() -> None:
    """The committer's side of the same brake: four unknown outcomes in a row neither halt
    the run nor are read ahead as halting it (so a commit still claims new items); the
    fifth does both."""
    progress = Progress(say=lambda line: None)
    brakes = Brakes(progress, streak_limit=5, down_after=3)
    lost = [
        Outcome(seq, ItemTrigger.LOSE, AttemptOutcome.UNCERTAIN, error="timed out")
        for seq in range(1, 6)
    ]
    channel_of = {outcome.seq: "hooks" for outcome in lost}
    assert not brakes.would_halt(lost[:4], channel_of)
    assert brakes.would_halt(lost, channel_of)
    for outcome in lost[:4]:
        brakes.after(outcome)
    assert progress.halt is None
    brakes.after(lost[4])
    assert progress.halt is not None and progress.halt[0] is Stop.HALTED
