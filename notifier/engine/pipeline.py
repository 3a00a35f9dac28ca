"""The slot mechanics of the continuous pipeline: sender threads fed by a queue, and the
per-channel token bucket of `--rate`.

The runner's main thread is the only committer: it hands claimed items (point A already
committed) and questions (items to ask the channel about) to the senders and takes their
results back to record. A sender only sends and asks; it never writes to the database.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from notifier.channels import Channel
    from notifier.store import Store

J = TypeVar("J")
R = TypeVar("R")
POLL_S = 0.2
# After the first finished send, how long the committer lets others finish before it takes
# them all into one commit, for every N items claimed ahead (see claim_ahead): fewer, larger
# commits cost less CPU per item (and the senders get the GIL while it sleeps), and the
# items claimed ahead keep the senders busy meanwhile; each outcome still goes into the very
# next commit. Measured at concurrency 16 with N ahead: against 1 ms, 4 ms took 8% less CPU
# per item at 0 and 20 ms latency; 8 ms was slower again, the senders running out of work.
GATHER_PER_N_AHEAD_S = 0.004


def claim_ahead(size: int, channels: Iterable[Channel]) -> int:
    """How many items beyond the `size` being sent are claimed ahead: point A committed,
    waiting for a free sender, so a slot that frees starts at once instead of after the
    next commit. The deeper, the fewer and larger the group commits: at concurrency 16 and
    0 ms, 3N ahead (gathering 12 ms) took 6% less CPU per item than N ahead (4 ms), with 15%
    fewer context switches, each commit's SQL statements being a wait for the GIL; 7% less
    at 20 ms. But after a kill -9 every item claimed ahead is in flight with nothing sent:
    resume settles it with one query where its channel can be asked (then sends it), and
    would have to leave it unknown for an operator where it cannot (SMTP, Apprise). So 3N
    ahead only when every channel of the run can be asked, and none otherwise (nor at N = 1,
    the sequential protocol): an item is claimed there only when a sender is free for it,
    so after a kill the unknown items are the requests really under way."""
    if size <= 1 or not all(channel.queryable for channel in channels):
        return 0
    return 3 * size


def in_flight_cap(channel: Channel) -> int | None:
    """The most items of `channel` in flight at once (None: only the run's concurrency):
    1 for a channel that sends one request at a time (not thread-safe), else its own
    `max_in_flight` when it has one (SMTP: max_connections). The claim never takes more,
    so an item is never claimed to wait for a connection inside the channel."""
    if not channel.thread_safe:
        return 1
    cap = channel.max_in_flight
    return cap if cap is not None and cap > 0 else None


class Senders(Generic[J, R]):
    """Up to `size` jobs (sends, queries) at once, in the order handed out. With size 1
    there is no thread at all (unless `threaded`): `submit` does the job right away in the
    caller's thread, so N = 1 is exactly the sequential protocol. `gather_s`: how long
    `results` waits for more once one job has finished. A second pool made with the first's
    `done` queue hands its results back through the first's `results`."""

    def __init__(
        self,
        size: int,
        send: Callable[[J], R],
        gather_s: float = 0.0,
        *,
        done: queue.SimpleQueue[tuple[J, R]] | None = None,
        threaded: bool | None = None,
        name: str = "send",
    ) -> None:
        self._send = send
        self._gather_s = gather_s
        self.done: queue.SimpleQueue[tuple[J, R]] = done or queue.SimpleQueue()
        self._work: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        threads = size if (size > 1 if threaded is None else threaded) else 0
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: J) -> None:
        if not self._threads:
            self.done.put((job, self._send(job)))
        else:
            self._work.put(job)

    def results(self, timeout: float | None) -> list[tuple[J, R]]:
        """Every finished job; with a timeout, wait up to that long for the first one."""
        done: list[tuple[J, R]] = []
        try:
            if timeout is not None and timeout > 0:
                done.append(self.done.get(timeout=timeout))
                if self._gather_s > 0:  # 0 with size 1: no other sender to wait for
                    time.sleep(self._gather_s)
            while True:
                done.append(self.done.get_nowait())
        except queue.Empty:
            return done

    def close(self) -> None:
        """Drop jobs not yet started (items still in flight or unknown in the database: the
        next worker settles them) and wait for the jobs under way to return."""
        try:
            while True:
                self._work.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        while (job := self._work.get()) is not None:
            self.done.put((job, self._send(job)))


class TokenBucket:
    """`rate` sends per second for one channel, shared by all its senders, with a burst of
    at most `rate` (and at least 1) tokens. Timed on the monotonic clock."""

    def __init__(self, rate: float, tokens: float | None = None) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        # A new process of a run that sent before starts with what is left of the bucket
        # (`tokens`), not full: a resume never sends faster than the rate.
        self._tokens = self.capacity if tokens is None else min(self.capacity, tokens)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, stop: Callable[[], bool], max_wait_s: float = math.inf) -> float | None:
        """Wait for a token: None once taken. Without one (as soon as `stop()` says so, or
        at once when the next token is further than `max_wait_s` away), the seconds until
        the next token."""
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return None
                wait = (1 - self._tokens) / self.rate
            if wait > max_wait_s or stop():
                return wait
            time.sleep(min(wait, POLL_S))


class SharedBucket:
    """`rate` sends per second for one channel of a run shared by many workers: the bucket
    lives in the database (rate_buckets), timed on the database server's clock, so every
    worker on every machine draws from the same tokens."""

    def __init__(
        self, store: Store, lock: threading.Lock, run_id: str, channel: str, rate: float
    ) -> None:
        self.store = store
        self.lock = lock  # the store's connection is shared with other sender threads
        self.run_id = run_id
        self.channel = channel
        self.rate = rate
        with lock:
            store.buckets.open_bucket(run_id, channel, rate)

    def take(self, stop: Callable[[], bool], max_wait_s: float = math.inf) -> float | None:
        """TokenBucket.take, the tokens being the database's. The next token is at most
        1 / rate away (the bucket's state lives in the database, so that is the bound)."""
        while True:
            with self.lock:
                if self.store.buckets.take_token(self.run_id, self.channel, self.rate):
                    return None
            if 1 / self.rate > max_wait_s or stop():
                return 1 / self.rate
            time.sleep(min(1 / self.rate, POLL_S))
