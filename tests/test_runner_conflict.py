"""A conflict halts the run however it shows up, including a receipt for another digest."""

from __future__ import annotations

from pathlib import Path

from notifier.channels import Ready, Receipt, always
from notifier.intent import Intent
from notifier.judging import Stop
from notifier.lease import LostFlag, holder_alive
from notifier.retry import RetryPolicy
from notifier.runner import Runner, RunOptions
from notifier.signals import Interruption
from notifier.state_machine import RunState
from notifier.store import Store


class AnswersForAnotherIntent:
    """A downstream that accepts, but reports holding a different digest under the key
    (the wire does not matter here: only what the answer says)."""

    name = "odd"
    idempotent = True
    queryable = False
    thread_safe = True

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
        store, "r1", {"odd": channel}, RetryPolicy(), RunOptions(),
        lease_version=version, lease_lost=LostFlag(), interrupted=Interruption(),
        say=lambda line: None,
    ).run()  # fmt: skip
    assert (result.stop, result.state) == (Stop.CONFLICT, RunState.HALTED)
    assert channel.sent == ["1", "2"]
    assert [(i.item_id, i.state.value) for i in store.queries.items("r1")] == [
        ("1", "sent"), ("2", "failed"), ("3", "pending"),
    ]  # fmt: skip
    assert "conflict" in (store.queries.item("r1", 2).last_error or "")
    store.close()
