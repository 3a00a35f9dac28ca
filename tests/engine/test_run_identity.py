"""What identifies a batch and a delivery: keys
unique forever (a per-run nonce), a replay on a first attempt is left unknown, "already
planned" decided by the content fingerprint in one transaction with the insert, and the
m002 migration of a database written before all this."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from notifier.api import planning
from notifier.api.env import Env
from notifier.config import load as load_config
from notifier.domain.errors import BadInput, ExitCode, NextStep
from notifier.domain.intent import content_fingerprint
from notifier.sandbox.server import Sandbox
from notifier.store import Store, parse_target
from notifier.store.history import RowHistory
from notifier.store.plans import Planning
from notifier.store.postgres import PostgresEngine

from ..conftest import Workspace, make_rows, wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FAST_RETRY = "[retry]\nmax_attempts = 4\nbackoff_base = 0.02\nbackoff_max = 0.1\n"


def webhook_config(ws: Workspace, url: str, *, timeout: int = 10) -> None:
    (ws.path / "notifier.toml").write_text(
        "[channels.hooks]\n"
        'type = "webhook"\n'
        f'url = "{url}"\n'
        "idempotent = true\n"
        f"timeout = {timeout}\n" + FAST_RETRY
    )


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with Sandbox() as running:
        yield running


class _AlwaysReplayed(BaseHTTPRequestHandler):
    """Answers every POST 200 as a replay of an earlier delivery, as a downstream that
    already holds the key would (sent from a copy of this database, or answering wrongly)."""

    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).posts += 1
        body = json.dumps({"id": "evt-from-last-week"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Idempotent-Replayed", "true")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def replaying_receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysReplayed)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/notifications"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------- point 4


@pytest.mark.timeout(60)
def test_a_replay_on_a_first_attempt_is_left_unknown_never_a_delivery(
    ws: Workspace, replaying_receiver: str
) -> None:
    """A downstream answering "replayed" to an item's first attempt: no attempt of ours
    explains it, so the item is left unknown (maybe delivered), never sent nor failed; the
    run halts as for a conflict (exit 4), and nothing is reported sent. Cancelled, the run
    reports it unknown still, and the file sent again is refused while it is unsettled."""
    webhook_config(ws, replaying_receiver)
    ws.write_csv("batch.csv", make_rows(3))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert result.exit_code == 4, result.output
    assert "replay" in result.output and "halted" in result.output, result.output
    status = ws.status()
    assert status["state"] == "halted"
    assert status["counts"]["sent"] == 0
    assert status["counts"]["unknown"] == 1
    assert ws.ledger.receipt_count() == 0
    first = ws.ledger.item("u1")
    assert first.state == "unknown" and "replay" in (first.last_error or ""), first
    assert [a.outcome for a in ws.ledger.attempts()] == ["uncertain"]
    # The run stopped at the replay: nothing after it was tried.
    assert len(ws.ledger.attempts()) == 1
    # Cancelled, it is still maybe delivered: reported unknown, and the file sent again is
    # refused while it is unsettled.
    cancelled = ws.invoke("cancel", "--report", "--format", "json")
    assert cancelled.exit_code == 3, cancelled.output
    report = json.loads(cancelled.stdout)
    assert report["state"] == "cancelled" and report["counts"]["unknown"] == 1, report
    assert [i["state"] for i in report["items"] if i["id"] == "u1"] == ["unknown"], report
    again = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert again.exit_code == 2, again.output
    assert len(ws.ledger.runs()) == 1
    assert ws.ledger.receipt_count() == 0


def test_two_databases_with_the_same_run_id_both_really_deliver(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """Two databases, the same --run-id and batch, one idempotent downstream: the second run
    gets keys of its own and really delivers (2N commits, no replays)."""
    webhook_config(ws, sandbox.notifications_url)
    ws.write_csv("batch.csv", make_rows(5))
    first = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "weekly")
    assert first.exit_code == 0, first.output
    other = Workspace(ws.path / "other")
    other.path.mkdir()
    second = other.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "weekly")
    assert second.exit_code == 0, second.output
    totals = sandbox.stats()["totals"]
    assert (totals["commits"], totals["replays"]) == (10, 0)
    assert set(ws.ledger.keys()).isdisjoint(other.ledger.keys())
    assert other.status()["counts"]["sent"] == 5


# ---------------------------------------------------------------------- point 3


def test_a_tuning_change_does_not_make_the_same_batch_new(ws: Workspace, sandbox: Sandbox) -> None:
    """After a send, `timeout = 10` → `20`: the same rows are still the ones delivered, so
    the same send (and its --dry-run) has nothing to send; nothing is delivered twice."""
    webhook_config(ws, sandbox.notifications_url, timeout=10)
    ws.write_csv("batch.csv", make_rows(4))
    first = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert first.exit_code == 0, first.output
    run_id = ws.ledger.run().run_id
    webhook_config(ws, sandbox.notifications_url, timeout=20)
    dry = ws.invoke("send", "batch.csv", "--channel", "hooks", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"already delivered with the same content by run {run_id}" in dry.output
    again = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert again.exit_code == 0, again.output
    assert "nothing to send" in again.output
    assert len(ws.ledger.runs()) == 1
    assert sandbox.stats()["totals"]["commits"] == 4


# ---------------------------------------------------------------------- point 5


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_two_plans_racing_to_insert_make_exactly_one_run(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `send`s of one batch, each with its own Store: the first is held inside its plan's
    transaction, its comparison with earlier runs made and nothing inserted yet, until the
    second has either made its own comparison or waits for the first (SQLite: at its BEGIN
    IMMEDIATE; PostgreSQL: on the plan lock). Exactly one run is planned, the other is
    refused (exit 2): its rows are open in the winner's run, which it names with `notifier
    resume`. Without the plan lock on PostgreSQL both comparisons find nothing planned and
    both plan every row."""
    ws.write_csv("batch.csv", make_rows(20))
    Store.open(ws.db, create=True).close()
    env = Env(
        parse_target(ws.db), load_config(ws.path / "notifier.toml", explicit=False), lambda s: None
    )
    first_compared, second_compared, release = (threading.Event() for _ in range(3))
    second_engine: list[Any] = []  # the second plan's engine, from its transaction's start
    compare, transaction = RowHistory.compare, Planning.transaction

    def held_compare(self: RowHistory, *args: Any, **kwargs: Any) -> Any:
        prior = compare(self, *args, **kwargs)
        if not first_compared.is_set():
            first_compared.set()
            assert release.wait(30)  # the first plan: inside its transaction, not inserted
        else:
            second_compared.set()
        return prior

    def seen_transaction(self: Planning) -> Any:
        if first_compared.is_set():
            second_engine.append(self.engine)
        return transaction(self)

    monkeypatch.setattr(RowHistory, "compare", held_compare)
    monkeypatch.setattr(Planning, "transaction", seen_transaction)

    def second_waits() -> bool:
        """Whether the second plan waits for the first one's transaction to end."""
        if not ws.url:
            return True  # SQLite: its first write waits for the first plan's write lock
        if not second_engine:
            return False
        engine = second_engine[0]
        assert isinstance(engine, PostgresEngine)
        pid = engine.raw.info.backend_pid
        sql = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?"
        return ws.query(sql, (pid,)) == [("Lock",)]

    outcomes: list[Store | BaseException] = []

    def plan_and_store() -> None:
        try:
            plan = planning.plan_batch(env, ws.path / "batch.csv", channel=None, run_id=None)
            stored = planning.store_plan(env, plan, ws.path / "batch.csv", {}, False)
            assert stored.store is not None
            outcomes.append(stored.store)
        except BaseException as exc:
            outcomes.append(exc)

    first, second = (threading.Thread(target=plan_and_store) for _ in range(2))
    first.start()
    try:
        wait_for(first_compared.is_set, "the first plan compared its rows", timeout=30)
        second.start()
        wait_for(
            lambda: second_compared.is_set() or second_waits(),
            "the second plan compared its rows or waits for the first",
            timeout=30,
        )
    finally:
        release.set()
        first.join(30)
    if second.is_alive() or second.ident is not None:
        second.join(30)
    stores = [o for o in outcomes if isinstance(o, Store)]
    for store in stores:
        store.close()
    run_id = ws.ledger.run().run_id
    [refused] = [o for o in outcomes if not isinstance(o, Store)]
    assert isinstance(refused, BadInput), refused
    assert refused.exit_code == ExitCode.BAD_INPUT
    assert (
        f"20 row(s) are still open (pending, in flight or unknown) in unfinished run {run_id}"
        in str(refused)
    )
    # What to do next is a fact the command line words (`notifier resume RUN`, or cancel).
    assert (refused.then, refused.then_run) == (NextStep.RESUME_OR_CANCEL_THEN_SEND_AGAIN, run_id)
    assert len(stores) == 1


# ---------------------------------------------------------------------- m002


def test_an_m001_database_with_a_run_in_flight_resumes_after_m002(ws: Workspace) -> None:
    """A database written before m002 with item 5 in flight: `resume` applies m002, settles
    item 5 by query (its file exists), sends 6-10 under the stored keys, every item
    delivered exactly once; re-sending the same batch has nothing to send."""
    shutil.copy(FIXTURES / "m001-inflight-run.db", ws.db_file)
    shutil.copytree(FIXTURES / "m001-inflight-run.outbox", ws.outbox)
    shutil.copy(FIXTURES / "m001-inflight-run.csv", ws.path / "batch.csv")
    before = {d["idempotency_key"]: d["written_at"] for d in ws.outbox_documents()}
    # Read in m001's schema (the ledger's read model is the current one's).
    keys_before = ws.query("SELECT seq, idempotency_key FROM items ORDER BY seq")
    assert ws.query("SELECT name FROM _sqlite_migrations") == [("m001_initial",)]

    result = ws.invoke("resume")
    assert result.exit_code == 0, result.output

    names = set(ws.ledger.migrations())
    assert {"m001_initial", "m002_key_nonce_content_fingerprint"} <= names
    # Keys are stored, never recomputed: the old run keeps them (and has no nonce).
    assert [(i.seq, i.idempotency_key) for i in ws.ledger.items()] == keys_before
    run = ws.ledger.run()
    nonce, stored_content = run.key_nonce, run.content_fingerprint
    assert nonce is None
    digests = [i.intent_digest for i in ws.ledger.items()]
    assert stored_content == content_fingerprint(digests, ["outbox"])
    status = ws.status()
    assert status["state"] == "completed"
    assert status["counts"]["sent"] == 10
    documents = ws.outbox_documents()
    assert sorted(d["idempotency_key"] for d in documents) == sorted(k for _, k in keys_before)
    # Items 1-5 were delivered before the upgrade and were not written again.
    assert {k: w for k, w in ((d["idempotency_key"], d["written_at"]) for d in documents)
            if k in before} == before  # fmt: skip
    fifth = next(i for i in ws.ledger.items() if i.seq == 5)
    assert ws.ledger.receipt_sources()[fifth.idempotency_key] == "query"

    again = ws.invoke("send", "batch.csv")
    assert again.exit_code == 0, again.output
    assert "already delivered with the same content by run m001-fixture" in again.output
    assert "nothing to send" in again.output
    assert len(ws.outbox_documents()) == 10
