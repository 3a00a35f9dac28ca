"""A conflict halts the run however it shows up, including a receipt for another digest
and a status query finding another digest under the item's key."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from notifier.channels import Ready, always
from notifier.domain.answers import Receipt
from notifier.domain.intent import Intent
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import RunState
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl, Stop
from notifier.engine.runner import Runner, RunOptions
from notifier.sandbox.server import Faults, Sandbox
from notifier.store import Store

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_send
from .test_webhook_e2e import webhook_config


class AnswersForAnotherIntent:
    """A downstream that accepts, but reports holding a different digest under the key
    (the wire does not matter here: only what the answer says)."""

    name = "odd"
    idempotent = True
    queryable = False
    thread_safe = True
    timeout_s = 0.0
    query_delay_s = 0.0
    suppress_on_reject = False
    max_in_flight: int | None = None

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        self.sent.append(intent.item_id)
        digest = "sha256:" + "f" * 64 if intent.item_id == "2" else intent.intent_digest
        return Receipt("r-" + intent.item_id, digest)

    def query(self, key: str) -> Receipt | None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_receipt_for_another_digest_fails_the_item_and_halts(tmp_path: Path) -> None:
    """The item is failed as a conflict, nothing after it is sent, and the run halts with
    the exit code for a safety refusal."""
    store = Store.open(tmp_path / "receipts.db", create=True)
    store.plans.create_run(
        {"run_id": "r1", "state": "planned", "created_at": "2026-11-30T00:00:00.000000+00:00",
         "batch_path": "b.csv", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
         "channel_snapshot": {},
         "options": {}, "contract_version": "v1"},
        [{"run_id": "r1", "seq": n, "item_id": str(n), "channel": "odd", "target": f"{n}@x.y",
          "payload": {}, "idempotency_key": f"k{n}", "intent_digest": f"sha256:{n}"}
         for n in (1, 2, 3)],
    )  # fmt: skip
    version = store.leases.acquire_lease("r1", {"host": "h", "pid": 1}, 30, holder_alive)
    channel = AnswersForAnotherIntent()
    result = Runner(
        store, store.core.get_run("r1"), {"odd": channel}, RetryPolicy(), RunOptions(),
        lease_version=version, control=RunControl(),
        say=lambda line: None,
    ).run()  # fmt: skip
    assert (result.stop, result.state) == (Stop.CONFLICT, RunState.HALTED)
    assert channel.sent == ["1", "2"]
    assert [(i.item_id, i.state.value) for i in store.queries.items("r1")] == [
        ("1", "sent"), ("2", "failed"), ("3", "pending"),
    ]  # fmt: skip
    assert "conflict" in (store.queries.item("r1", 2).last_error or "")
    store.close()


FOREIGN_DIGEST = "sha256:" + "f" * 64


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """The repo's sandbox receiver on 127.0.0.1, with the faults a test parametrises."""
    faults = getattr(request, "param", Faults())
    with Sandbox(faults=faults) as running:
        yield running


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


@pytest.mark.both_stores
def test_status_query_answering_another_digest_is_a_conflict(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """A status query answering 200 with another digest is a conflict: exit 4, no receipt."""
    webhook_config(ws, sandbox, status=True, max_attempts=3)
    ws.write_csv("batch.csv", make_rows(2))
    crash_send("after-intent:1", db=ws.db, channel="hooks", concurrency=1)
    first = ws.ledger.item("u1")
    key = first.idempotency_key
    assert first.state == "in_flight"
    # The receiver holds another intent under item 1's key (a reused run id, another database).
    post_foreign_delivery(sandbox, key)

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 4, resumed.output
    assert "CONFLICT" in resumed.output and FOREIGN_DIGEST in resumed.output
    first = ws.ledger.item("u1")
    assert first.state == "failed" and first.receipt_id is None
    assert "conflict" in (first.last_error or "")
    assert ws.ledger.receipt_count() == 0
    assert "sent" not in ws.ledger.state_counts()
    assert ws.ledger.run().state == "halted"
    # Only the foreign POST ever reached the receiver: nothing of ours was sent over it.
    assert sandbox.stats()["totals"]["requests"] == 1
    assert sandbox.stats()["keys"][key] == {"commits": 1, "replays": 0, "refused": 0}
