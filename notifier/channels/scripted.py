"""An in-process downstream whose answers a script gives, as httpx's MockTransport stands in
for the network: the engine runs whole, on either store, with no socket and no clock but its
own. Tests build one per channel name and hand them to `Notifier.open(db, channels=...)`.

The script maps each request to an `Response`: delivered, delivered but the answer lost
(uncertain), not delivered but the answer lost, throttled, refused before anything left,
rejected. Like a careful real receiver it keeps what it committed by key, so a replay under a
committed key is answered from the first delivery (when it dedupes), a status query tells the
truth (when it can be asked), and `deliveries` counts what reached it, which is what "never sent
twice" is measured against."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from notifier.channels.base import Ready, always, go_ahead
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent


class Kind(Enum):
    DELIVER = "deliver"  # committed, answered
    LOST_AFTER_COMMIT = "lost_after_commit"  # committed, then the answer was lost (a timeout)
    LOST_BEFORE_COMMIT = "lost_before_commit"  # the answer lost and nothing committed
    THROTTLE = "throttle"  # 429 with Retry-After: nothing committed
    REFUSE = "refuse"  # the connection refused: nothing left
    REJECT = "reject"  # a 4xx: never accepted


@dataclass(frozen=True)
class Response:
    kind: Kind
    retry_after: float = 0.0
    latency: float = 0.0  # seconds the request takes before its answer


DELIVER = Response(Kind.DELIVER)
LOST_AFTER_COMMIT = Response(Kind.LOST_AFTER_COMMIT)
LOST_BEFORE_COMMIT = Response(Kind.LOST_BEFORE_COMMIT)
REFUSE = Response(Kind.REFUSE)
REJECT = Response(Kind.REJECT)


def throttle(retry_after: float) -> Response:
    return Response(Kind.THROTTLE, retry_after=retry_after)


# The script: given the intent and how many requests this item has made so far (0 for the
# first), the answer. The default delivers everything.
Script = Callable[[Intent, int], Response]


def always_deliver(intent: Intent, tries: int) -> Response:
    return DELIVER


class ScriptedChannel:
    """A downstream that answers by script (see the module docstring)."""

    thread_safe = True
    # Every answer is final when it is given (a late commit is scripted as such): no window.
    timeout_s = 0.0
    query_delay_s = 0.0
    suppress_on_reject = False
    max_in_flight: int | None = None

    def __init__(
        self,
        name: str,
        script: Script = always_deliver,
        *,
        idempotent: bool = True,
        queryable: bool = True,
    ) -> None:
        self.name = name
        self.script = script
        self.idempotent = idempotent
        self.queryable = queryable
        self.deliveries: Counter[str] = Counter()  # key -> times it reached the receiver
        self.requests: Counter[str] = Counter()  # item id -> requests made
        self.queries: Counter[str] = Counter()  # key -> status queries asked
        self._committed: dict[str, str] = {}  # key -> digest of the first delivery
        self._lock = threading.Lock()

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        go_ahead(ready)
        with self._lock:
            tries = self.requests[intent.item_id]
            self.requests[intent.item_id] += 1
        answer = self.script(intent, tries)
        if answer.latency:
            time.sleep(answer.latency)
        key = intent.idempotency_key
        if answer.kind is Kind.REFUSE:
            raise ChannelError(
                ErrorKind.NOT_SENT, f"{self.name}: connection refused", unreachable=True
            )
        if answer.kind is Kind.THROTTLE:
            raise ChannelError(
                ErrorKind.THROTTLED,
                f"{self.name}: 429",
                http_status=429,
                retry_after=answer.retry_after,
            )
        if answer.kind is Kind.REJECT:
            raise ChannelError(ErrorKind.PERMANENT, f"{self.name}: 400", http_status=400)
        if answer.kind is Kind.LOST_BEFORE_COMMIT:
            raise ChannelError(ErrorKind.UNCERTAIN, f"{self.name}: timed out")
        with self._lock:
            replayed = self.idempotent and key in self._committed
            if not replayed:
                self._committed.setdefault(key, intent.intent_digest)
                self.deliveries[key] += 1
        if answer.kind is Kind.LOST_AFTER_COMMIT:
            raise ChannelError(ErrorKind.UNCERTAIN, f"{self.name}: timed out")
        return Receipt(f"{self.name}:{key}", self._committed[key], replayed=replayed)

    def query(self, key: str) -> Receipt | None:
        with self._lock:
            self.queries[key] += 1
            digest = self._committed.get(key)
        if not self.queryable:
            raise ChannelError(ErrorKind.UNCERTAIN, f"{self.name} cannot be asked by key")
        return None if digest is None else Receipt(f"{self.name}:{key}", digest)

    def close(self) -> None:
        pass

    def twice(self) -> dict[str, int]:
        """The keys that reached the receiver more than once (never, if the promise holds)."""
        with self._lock:
            return {key: n for key, n in self.deliveries.items() if n > 1}


class Channels:
    """A channel builder for `Notifier.open(db, channels=...)`: the same scripted channel for a name
    every time a run is worked (resume, cancel, reconcile), so its memory outlives a process
    the way a real receiver's does."""

    def __init__(self, **scripted: ScriptedChannel) -> None:
        self.by_name = scripted

    def __call__(self, name: str, definition: dict[str, Any], base_dir: Any) -> ScriptedChannel:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"no scripted channel named {name!r}") from None
