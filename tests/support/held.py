"""The real Runner in-process, for tests where only the order of events matters: a channel
whose every request waits until the test answers it, and a committer that can be held on the
first answers it takes up, before judging them, so that what a sender does meanwhile is the
senders' own doing. Every wait here is on a condition, bounded by WAIT_S."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from notifier.channels import Ready, always, go_ahead
from notifier.domain import clock
from notifier.domain.answers import ChannelError, Receipt
from notifier.domain.intent import Intent
from notifier.domain.records import Item
from notifier.domain.retry import RetryPolicy
from notifier.engine.crash import CrashPlan
from notifier.engine.judging import SendResult
from notifier.engine.membership import holder_alive
from notifier.engine.run_control import RunControl
from notifier.engine.runner import Runner, RunOptions, RunResult
from notifier.engine.sending import Asked
from notifier.engine.settle_by_query import Question
from notifier.store import Store

from .workspace import Workspace

WAIT_S = 30.0  # no hold or wait here lasts longer than this


@dataclass
class Holding:
    """A downstream that holds every request until `release`, noting each one started."""

    name: str = "hooks"
    idempotent: bool = True
    queryable: bool = True
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    started: list[str] = field(default_factory=list)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        self.started.append(intent.item_id)
        self.release.wait(WAIT_S)
        return Receipt("r-" + intent.item_id, intent.intent_digest)

    def query(self, key: str) -> Receipt | None:
        return None

    def close(self) -> None:
        pass


@dataclass
class Answered:
    """A downstream whose every request waits until the test answers it (`answer(item_id)`
    once the item is let go): the wire does not matter, only the order of events. Like a
    real channel it asks the sender's last check before its request leaves."""

    idempotent: bool = True
    queryable: bool = True
    answer: Callable[[str], Receipt | ChannelError] = lambda item: Receipt("r-" + item)
    holds: bool = False  # what a status query finds: a delivery, or nothing
    name: str = "hooks"
    thread_safe: bool = True
    timeout_s: float = 0.0  # no window: each answer is final
    query_delay_s: float = 0.0
    suppress_on_reject: bool = False
    max_in_flight: int | None = None
    started: list[tuple[str, float]] = field(default_factory=list)  # (item, monotonic)
    answered: dict[str, float] = field(default_factory=dict)  # item -> monotonic
    _go: dict[str, threading.Event] = field(default_factory=dict)
    _all: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        go_ahead(ready)
        item = intent.item_id
        with self.changed:
            go = self._go.setdefault(item, threading.Event())
            self.started.append((item, time.monotonic()))
            self.changed.notify_all()
        while not (go.wait(0.01) or self._all.is_set()):
            pass
        answer = self.answer(item)
        with self.changed:
            self.answered[item] = time.monotonic()
        if isinstance(answer, ChannelError):
            raise answer
        return answer

    def let_go(self, item: str) -> None:
        with self.changed:
            self._go.setdefault(item, threading.Event()).set()

    def let_all_go(self) -> None:
        self._all.set()

    def wait_started(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.started) >= count, WAIT_S), (
                f"{len(self.started)} of {count} requests started"
            )

    def query(self, key: str) -> Receipt | None:
        return Receipt("r-" + key) if self.holds else None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class CommitterHeld(CrashPlan):
    """Holds the committer on the first answers it takes up, before it judges them."""

    point: str = "after-send"
    seq: int = 0
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def at(self, point: str, seqs: Iterable[int]) -> None:
        if point == self.point and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(WAIT_S), "the test never let the committer go on"


class HeldRun:
    """The Runner of run r1 (`items` items, each with the `plan` columns given, to `to` when
    set) on `channel` at --concurrency `n`, in a thread, counting every job its senders
    finish (a send made or held back); its committer held on the first answers it takes up
    unless `hold` is False."""

    def __init__(
        self,
        ws: Workspace,
        channel: Answered,
        n: int,
        items: int,
        *,
        hold: bool = True,
        to: str | None = None,
        **plan: str,
    ) -> None:
        self.store = Store.open(ws.db, create=True)
        self.store.plans.create_run(
            {"run_id": "r1", "state": "planned", "created_at": clock.now_iso(),
             "batch_path": "b", "fingerprint": "sha256:x", "content_fingerprint": "sha256:c",
             "channel_snapshot": {"hooks": {"type": "webhook"}}, "options": {},
             "contract_version": "v1"},
            [{"run_id": "r1", "seq": i, "item_id": str(i), "channel": "hooks",
              "target": to or f"{i}@x.y", "payload": {}, "idempotency_key": f"k{i}",
              "intent_digest": f"sha256:{i}", **plan} for i in range(1, items + 1)],
        )  # fmt: skip
        version = self.store.leases.acquire_lease(
            "r1", {"host": "h", "pid": os.getpid()}, 30, holder_alive
        )
        self.held = CommitterHeld()
        self.runner = Runner(
            self.store, self.store.core.get_run("r1"),
            {"hooks": channel}, RetryPolicy.from_settings(5, 60, 0.01, 0.05),
            RunOptions(concurrency=n), lease_version=version, control=RunControl(),
            crash=self.held if hold else None,
            say=lambda line: None,
        )  # fmt: skip
        self.taken: list[object] = []  # each job's result, as its sender finished it
        self.changed = threading.Condition()
        send_one = self.runner._senders._send

        def counted(job: Item | Question) -> SendResult | Asked:
            slot = send_one(job)
            with self.changed:
                self.taken.append(slot.result if isinstance(slot, SendResult) else slot)
                self.changed.notify_all()
            return slot

        self.runner._senders._send = counted
        self.results: list[RunResult] = []
        self.thread = threading.Thread(target=lambda: self.results.append(self.runner.run()))

    def wait_taken(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.taken) >= count, WAIT_S), (
                f"the senders finished {len(self.taken)} of {count} jobs"
            )

    def finish(self, channel: Answered) -> RunResult:
        channel.let_all_go()
        self.held.go.set()
        self.thread.join(WAIT_S)
        self.store.close()
        assert self.results, "the run did not end"
        return self.results[0]
