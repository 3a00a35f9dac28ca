"""Prometheus metrics of a run (--metrics-port, `notifier metrics`), through prometheus_client.

Two sources, one registry of our own (never the library's global one, which would also
export this process's GC and platform figures and outlive the command):
- `RunCollector` reads the run from the database on every scrape, through a read-only
  connection of its own, in one read transaction: items by state, the unknown count, the
  run's state, every worker's finished attempts by channel and outcome, Claude tokens. It
  is what `status` reads, so the two agree, and what `notifier metrics` prints: the one
  truth of a run shared by many workers.
- `ProcessMetrics` counts what only this process sees, as the runner tells it (an Observer):
  its sends by channel and outcome, their durations, the seconds a channel's gate was
  closed, the --rate waits.

Labels are run_id, channel, state and outcome only, each from a fixed vocabulary or the
operator's own names: never a recipient, a key, an item id or a subject (unbounded, and
personal data in a monitoring system)."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from notifier.domain import clock
from notifier.domain.errors import BadInput
from notifier.domain.state_machine import ItemState, RunState
from notifier.observe import Observer, answer_outcome

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

    from notifier.domain.records import Item
    from notifier.engine.judging import Sent
    from notifier.store import Store

# Sends last from milliseconds (a local relay) to the channel's timeout (30 s by default).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RunCollector(Collector):
    """The run's figures as the database holds them, read at each scrape. `open_store`
    opens a read-only connection; `run_ids` says which runs (a `send` learns its run id
    only once the plan is stored: until then a scrape shows nothing)."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        run_ids: Callable[[], Sequence[str]],
        *,
        owns_store: bool = True,
    ) -> None:
        self.open_store = open_store
        self.run_ids = run_ids
        self.owns_store = owns_store  # closed after each scrape (a connection per scrape)

    def collect(self) -> Iterator[Metric]:
        ids = list(self.run_ids())
        if not ids:
            return
        store = self.open_store()
        try:
            yield from self.read(store, ids)
        finally:
            if self.owns_store:
                store.close()

    def read(self, store: Store, run_ids: Sequence[str]) -> list[Metric]:
        """The metric families of `run_ids`, from one committed state of `store`."""
        from notifier.ops.report import effective_state  # noqa: PLC0415 (loads the lease module)
        from notifier.store.drafts import run_counts  # noqa: PLC0415

        items = GaugeMetricFamily(
            "notifier_items", "Items of the run in each state, as `status` counts them.",
            labels=["run_id", "state"],
        )  # fmt: skip
        unknown = GaugeMetricFamily(
            "notifier_unknown_items",
            "Items whose outcome is unknown (maybe delivered): a reconcile settles them.",
            labels=["run_id"],
        )
        state = GaugeMetricFamily(
            "notifier_run_state", "1 for the run's state (a dead worker's run reads paused).",
            labels=["run_id", "state"],
        )  # fmt: skip
        attempts = CounterMetricFamily(
            "notifier_attempts",
            "Finished attempts of every worker of the run, by channel and outcome.",
            labels=["run_id", "channel", "outcome"],
        )
        tokens_in = CounterMetricFamily(
            "notifier_claude_input_tokens", "Input tokens of the run's Claude drafts.",
            labels=["run_id"],
        )  # fmt: skip
        tokens_out = CounterMetricFamily(
            "notifier_claude_output_tokens", "Output tokens of the run's Claude drafts.",
            labels=["run_id"],
        )  # fmt: skip
        with store.reading():
            for run_id in run_ids:
                try:
                    run = store.core.get_run(run_id)
                except KeyError:
                    continue  # a run id given before its plan is stored
                counts = run_counts(store, run)
                for s in ItemState:
                    items.add_metric([run_id, s.value], getattr(counts, s.value))
                unknown.add_metric([run_id], counts.unknown)
                now = effective_state(store, run)
                for rs in RunState:
                    state.add_metric([run_id, rs.value], 1 if rs is now else 0)
                for channel, outcome, n in store.queries.attempt_tally(run_id):
                    attempts.add_metric([run_id, channel, outcome], n)
                summary = store.drafts.draft_summary(run_id)  # 0 for a run drafted by no model
                tokens_in.add_metric([run_id], summary["input_tokens"])
                tokens_out.add_metric([run_id], summary["output_tokens"])
        return [items, unknown, state, attempts, tokens_in, tokens_out]


def exposition(store: Store, run_ids: Sequence[str]) -> str:
    """`notifier metrics`: the database's figures in the text format, read through `store`
    (the caller's read-only connection, which it closes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(lambda: store, lambda: run_ids, owns_store=False))
    return generate_latest(registry).decode("utf-8")


class GateClock:
    """Seconds each channel's gate has been closed, up to now: a gate closed until T counts
    only the time that has really passed (a run that stops early counts no more)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, tuple[float, float]] = {}  # channel → (closed at, until)
        self._done: dict[str, float] = {}  # channel → seconds of spans already over

    def close(self, channel: str, now: float, until: float) -> None:
        with self._lock:
            span = self._spans.get(channel)
            if span is not None and span[1] > now:
                self._spans[channel] = (span[0], max(span[1], until))  # still closed: longer
                return
            if span is not None:
                self._done[channel] = self._done.get(channel, 0.0) + span[1] - span[0]
            self._spans[channel] = (now, until)

    def seconds(self, now: float) -> dict[str, float]:
        with self._lock:
            out = dict(self._done)
            for channel, (start, until) in self._spans.items():
                out[channel] = out.get(channel, 0.0) + max(0.0, min(now, until) - start)
            return out


class ProcessMetrics(Observer):
    """This process's own counts, fed by the runner (see Observer), in `registry`."""

    def __init__(self, registry: CollectorRegistry, run_id: Callable[[], str]) -> None:
        self.run_id = run_id
        self.sends = Counter(
            "notifier_sends",
            "Requests this process sent, by channel and the answer's outcome.",
            ["run_id", "channel", "outcome"],
            registry=registry,
        )
        self.durations = Histogram(
            "notifier_attempt_duration_seconds",
            "How long this process's requests took, from leaving to the answer.",
            ["run_id", "channel"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.rate_waits = Counter(
            "notifier_rate_waits",
            "Sends of this process that waited for a --rate token.",
            ["run_id", "channel"],
            registry=registry,
        )
        self.rate_wait_seconds = Counter(
            "notifier_rate_wait_seconds",
            "Seconds this process's senders waited for --rate tokens.",
            ["run_id", "channel"],
            registry=registry,
        )
        self.gates = GateClock()
        registry.register(_GateCollector(self.gates, run_id))

    def answered(self, item: Item, result: Sent, started: datetime | None) -> None:
        outcome = answer_outcome(result)
        if outcome is None or started is None:
            return  # no request left (a failure before it, judged uncertain): not a send
        run_id = self.run_id()
        self.sends.labels(run_id, item.channel, outcome).inc()
        seconds = max(0.0, (clock.now() - started).total_seconds())
        self.durations.labels(run_id, item.channel).observe(seconds)

    def gated(self, channel: str, now: float, until: float) -> None:
        self.gates.close(channel, now, until)

    def rate_waited(self, channel: str, seconds: float) -> None:
        if seconds < 0.001:
            return  # a token was there: no wait
        self.rate_waits.labels(self.run_id(), channel).inc()
        self.rate_wait_seconds.labels(self.run_id(), channel).inc(seconds)


class _GateCollector(Collector):
    def __init__(self, gates: GateClock, run_id: Callable[[], str]) -> None:
        self.gates = gates
        self.run_id = run_id

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "notifier_channel_gated_seconds",
            "Seconds a channel was closed by throttled answers (429, 503, SMTP 421/45x), "
            "as this process saw it.",
            labels=["run_id", "channel"],
        )
        for channel, seconds in sorted(self.gates.seconds(time.monotonic()).items()):
            family.add_metric([self.run_id(), channel], seconds)
        yield family


class MetricsServer(ProcessMetrics):
    """--metrics-port: the registry served on 127.0.0.1:PORT while the command runs. Bound
    when made, before anything is stored, so a port in use is bad input (exit 2)."""

    def __init__(self, port: int, open_store: Callable[[], Store]) -> None:
        from prometheus_client import start_http_server  # noqa: PLC0415

        self.port = port
        self._run_ids: list[str] = []
        registry = CollectorRegistry(auto_describe=False)
        super().__init__(registry, lambda: self._run_ids[0] if self._run_ids else "")
        registry.register(RunCollector(open_store, lambda: list(self._run_ids)))
        try:
            server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        except OSError as exc:
            why = (
                "another process is listening there"
                if exc.errno == errno.EADDRINUSE
                else exc.strerror or str(exc)
            )
            raise BadInput(
                f"--metrics-port {port}: cannot serve metrics on 127.0.0.1:{port}: {why}. "
                "Nothing was stored or sent. Run the command again with a free "
                f"--metrics-port, or stop what holds it (`ss -ltnp 'sport = :{port}'` shows "
                "what)."
            ) from None
        self._server: WSGIServer | None = server
        self._thread = thread

    def planned(
        self, run_id: str, total: int, per_channel: dict[str, int], event: str = "plan"
    ) -> None:
        if run_id not in self._run_ids:
            self._run_ids.append(run_id)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
