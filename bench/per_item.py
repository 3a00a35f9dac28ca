"""What one `send` does per item, counted in-process: the decisions made per answer, the
throttle gates computed per throttled answer, the reads of the run's row before the first send
and per item, and the SQL statements per item, by name.

The scenarios, on a temporary SQLite file (each run also prints the CPU of each kind of
thread, on its own CPU clock, and in `happy` the main thread's by phase):

- `happy`: `notifier send` (the CLI, in this process) of a webhook channel against the fast
  receiver (bench/receiver.py, its own process, 0 ms): every answer a 201.
- `mixed`: the in-process API with a scripted channel that cannot dedupe but can be asked by
  key (channels/scripted.py): every 25th item's first answer throttled (429, Retry-After 0),
  every 7th item's first answer lost after it was committed (uncertain: a status query).
- `plain`: bench/throughput.py's plain loop against the fast receiver, for the threads' CPU.

With --timers (and no counting), the CPU of the committer's main blocks (store/ledger.py's
group commit, judging, the revisit) on its own CPU clock, and with --sql that of each SQL
statement the committer sends (binding and SQLite's own work; the events' insert at COMMIT
is in `SqliteEngine.commit`); with --profile, every thread under
cProfile on its own CPU clock, merged by kind (the main thread; the senders). cProfile slows
small Python calls much more than C ones (SQLite): read it for shape and counts, and the
timers for the split.

    python bench/per_item.py [--scenario happy|mixed|plain] [--items 4000] [--concurrency 16]
                             [--timers [--sql] | --profile [--sort cumulative] [--top 40]]
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


class Tally:
    """Counts by name, split at the first send (`phase`), safe across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase = "before the first send"
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, kind: str, name: str) -> None:
        with self.lock:
            self.counts[(self.phase, kind, name)] += 1

    def sent(self) -> None:
        with self.lock:
            self.phase = "sending"

    def total(self, phase: str, kind: str) -> int:
        return sum(n for (p, k, _), n in self.counts.items() if p == phase and k == kind)

    def by_name(self, phase: str, kind: str) -> list[tuple[str, int]]:
        rows = [(name, n) for (p, k, name), n in self.counts.items() if p == phase and k == kind]
        return sorted(rows, key=lambda row: -row[1])


def statement_names() -> dict[str, str]:
    """Each statement of the catalogue (store/statements/) by its text: `module.NAME`."""
    import importlib  # noqa: PLC0415
    import pkgutil  # noqa: PLC0415

    from notifier.store import statements  # noqa: PLC0415

    names: dict[str, str] = {}
    for info in pkgutil.iter_modules(statements.__path__):
        module = importlib.import_module(f"{statements.__name__}.{info.name}")
        for attr, value in vars(module).items():
            if attr.isupper() and isinstance(value, str):
                names.setdefault(value, f"{info.name}.{attr}")
    return names


def name_of(statement: str, names: dict[str, str]) -> str:
    known = names.get(statement)
    if known is not None:
        return known
    return " ".join(statement.split())[:70]


@contextmanager
def spies(tally: Tally) -> Iterator[None]:
    """Count the decisions, the gate computations, the statements and the run reads."""
    from notifier.domain.retry import RetryPolicy  # noqa: PLC0415
    from notifier.engine import judging, settle_by_query  # noqa: PLC0415
    from notifier.store.sqlite import SqliteEngine  # noqa: PLC0415

    names = statement_names()
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, attr)
        saved.append((owner, attr, original))
        setattr(owner, attr, make(original))

    def caller(depth: int = 1) -> str:
        """Who called the spied function (`depth` frames up, outermost first)."""
        frame = sys._getframe(2)
        chain: list[str] = []
        while frame is not None and len(chain) < depth:
            chain.append(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}")
            frame = frame.f_back  # type: ignore[assignment]
        return " < ".join(chain)

    def counted(kind: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                tally.add(kind, caller())
                return original(*args, **kwargs)

            return wrapper

        return make

    def sql(original: Any) -> Any:
        def execute(self: Any, statement: str, params: Any = None) -> Any:
            name = name_of(statement, names)
            tally.add("statement", name)
            if " FROM runs " in f"{statement} ":
                tally.add("run read", f"{name} (from {caller(4)})")
            return original(self, statement, params)

        return execute

    def decisions(original: Any) -> Any:
        def decide(item: Any, evidence: Any, **kwargs: Any) -> Any:
            result = getattr(evidence, "result", None)
            what = (
                type(evidence).__name__
                if result is None
                else getattr(getattr(result, "kind", None), "value", type(result).__name__)
            )
            tally.add("decide", f"{caller()}, {what}")
            return original(item, evidence, **kwargs)

        return decide

    # The modules that call `decide` (the sender asks only whether an answer wants a finding).
    for module in (judging, settle_by_query):
        patch(module, "decide", decisions)
    patch(judging.Progress, "gate", counted("gate closed"))
    patch(RetryPolicy, "judge", counted("policy.judge"))
    patch(SqliteEngine, "execute", sql)
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


# Blocks of the committer whose CPU is timed on the calling thread's CPU clock (inclusive:
# a block inside another counts in both), `--timers`. (module, class or None, function).
TIMED = [
    ("notifier.engine.runner", "Runner", "_commit"),
    ("notifier.store.ledger", "Ledger", "step"),
    ("notifier.store.ledger", "Ledger", "_record_acks"),
    ("notifier.store.ledger", "Ledger", "_claim"),
    ("notifier.store.ledger", "Ledger", "_claimable"),
    ("notifier.store.core", "Core", "events"),
    ("notifier.store.core", "Core", "_begin_fenced"),
    ("notifier.store.core", "Core", "_commit"),
    ("notifier.engine.judging", "Judge", "safely"),
    ("notifier.engine.judging", "Judge", "history"),
    ("notifier.engine.runner", "Runner", "_revisit"),
    ("notifier.engine.runner", "Runner", "_read_flags"),
    ("notifier.engine.runner", "Runner", "_drop_stale"),
    ("notifier.engine.runner", "Runner", "_hand_out"),
    ("notifier.engine.pipeline", "Senders", "results"),
    ("notifier.domain.records", None, "item_from_row"),
    ("notifier.store.sqlite", None, "_named_row"),
    ("notifier.store.sqlite", "SqliteEngine", "commit"),
    ("notifier.store.chaining", None, "linked"),
    ("notifier.store.chaining", None, "head_of"),
]
TIMES: defaultdict[str, float] = defaultdict(float)
# With --sql: each statement's CPU on the committer's (main) thread, by name, and its count.
SQL_TIMES: defaultdict[str, float] = defaultdict(float)
SQL_COUNTS: Counter[str] = Counter()


@contextmanager
def sql_timers(enabled: bool) -> Iterator[None]:
    """Each statement the main thread sends, timed on its CPU clock (`--sql`)."""
    if not enabled:
        yield
        return
    from notifier.store.sqlite import SqliteEngine  # noqa: PLC0415

    names = statement_names()
    original = SqliteEngine.execute
    main = threading.main_thread()

    def execute(self: Any, statement: str, params: Any = None) -> Any:
        if threading.current_thread() is not main:
            return original(self, statement, params)
        start = time.thread_time()
        try:
            return original(self, statement, params)
        finally:
            name = name_of(statement, names)
            SQL_TIMES[name] += time.thread_time() - start
            SQL_COUNTS[name] += 1

    SqliteEngine.execute = execute  # type: ignore[method-assign]
    try:
        yield
    finally:
        SqliteEngine.execute = original  # type: ignore[method-assign]


@contextmanager
def timers(enabled: bool) -> Iterator[None]:
    """Each TIMED block's CPU on the thread that runs it (the committer's, here)."""
    import importlib  # noqa: PLC0415

    saved: list[tuple[Any, str, Any]] = []
    if enabled:
        for module_name, owner_name, attr in TIMED:
            module = importlib.import_module(module_name)
            owner = module if owner_name is None else getattr(module, owner_name)
            original = getattr(owner, attr)
            label = f"{owner_name or module_name.rsplit('.', 1)[-1]}.{attr}"

            def timed(*args: Any, _original: Any = original, _label: str = label,
                      **kwargs: Any) -> Any:  # fmt: skip
                start = time.thread_time()
                try:
                    return _original(*args, **kwargs)
                finally:
                    TIMES[_label] += time.thread_time() - start

            saved.append((owner, attr, original))
            setattr(owner, attr, timed)
            # A module that imported the function by name holds its own reference.
            if owner_name is None:
                for other in list(sys.modules.values()):
                    if other is not None and getattr(other, attr, None) is original:
                        saved.append((other, attr, original))
                        setattr(other, attr, timed)
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


@contextmanager
def profiled(
    enabled: bool,
) -> Iterator[tuple[list[tuple[str, cProfile.Profile]], defaultdict[str, float]]]:
    """The CPU time of every thread started meanwhile, by kind (the senders together), and
    with `enabled` each thread (this one too) under a cProfile of its own timed by that
    thread's CPU clock, so that time spent waiting (for the GIL, a socket, a queue) counts
    nowhere."""
    profiles: list[tuple[str, cProfile.Profile]] = []
    cpu: defaultdict[str, float] = defaultdict(float)
    run = threading.Thread.run

    def measured_run(self: threading.Thread) -> None:
        kind = self.name.rstrip("0123456789-") or self.name
        try:
            if enabled:
                profile = cProfile.Profile(time.thread_time)
                profiles.append((kind, profile))
                profile.runcall(run, self)
            else:
                run(self)
        finally:
            cpu[kind] += time.thread_time()

    threading.Thread.run = measured_run  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    if enabled:
        profiles.append(("main", main))
        main.enable()
    start = time.thread_time()
    try:
        yield profiles, cpu
    finally:
        cpu["main (plan, committer)"] += time.thread_time() - start
        main.disable()
        threading.Thread.run = run  # type: ignore[method-assign]


def write_batch(path: Path, items: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "to", "subject", "body", "plan"])
        for i in range(1, items + 1):
            writer.writerow([f"b{i}", f"user{i}@example.com", f"Notice {i}",
                             f"Hello user {i}, your report is ready.", "team"])  # fmt: skip


# The main thread's CPU by phase (`happy`): seconds of its CPU clock.
PHASES: defaultdict[str, float] = defaultdict(float)


def happy(work: Path, items: int, concurrency: int, tally: Tally) -> int:
    """`notifier send` through the CLI against the fast receiver; the answers counted."""
    from notifier.api import working  # noqa: PLC0415
    from notifier.channels.webhook import WebhookChannel  # noqa: PLC0415
    from notifier.cli import cli  # noqa: PLC0415

    work_run = working.work_run

    def phased(*args: Any, **kwargs: Any) -> Any:
        PHASES["plan (CLI start to the run's lease)"] += time.thread_time() - begun
        start = time.thread_time()
        try:
            return work_run(*args, **kwargs)
        finally:
            PHASES["committer (the run, main thread)"] += time.thread_time() - start

    working.work_run = phased

    receiver = subprocess.Popen(
        [sys.executable, str(HERE.parent / "receiver.py")], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    url = receiver.stdout.readline().split()[-1]
    base = url.removesuffix("/notifications")
    (work / "notifier.toml").write_text(
        f'[channels.hooks]\ntype = "webhook"\nurl = "{url}"\n'
        f'status_url = "{base}/notifications/{{key}}"\nidempotent = true\n'
    )
    answers = Counter[str]()
    send = WebhookChannel.send

    def counted_send(self: WebhookChannel, *args: Any, **kwargs: Any) -> Any:
        tally.sent()
        try:
            receipt = send(self, *args, **kwargs)
        except Exception:
            answers["error"] += 1
            raise
        answers["receipt"] += 1
        return receipt

    WebhookChannel.send = counted_send  # type: ignore[method-assign]
    os.chdir(work)
    begun = time.thread_time()
    try:
        args = ["send", "batch.csv", "--channel", "hooks", "--concurrency", str(concurrency)]
        try:
            cli.main(args, prog_name="notifier", standalone_mode=False)
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise
    finally:
        working.work_run = work_run
        WebhookChannel.send = send  # type: ignore[method-assign]
        receiver.terminate()
        receiver.wait()
    print(f"answers: {dict(answers)}")
    return sum(answers.values())


def plain(work: Path, items: int, concurrency: int, tally: Tally) -> int:
    """The plain loop of bench/throughput.py against the fast receiver, for comparison."""
    sys.path.insert(0, str(HERE.parent))
    from throughput import plain_http  # noqa: PLC0415

    receiver = subprocess.Popen(
        [sys.executable, str(HERE.parent / "receiver.py")], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    try:
        plain_http(receiver.stdout.readline().split()[-1], items, concurrency)
    finally:
        receiver.terminate()
        receiver.wait()
    return items


def mixed(work: Path, items: int, concurrency: int, tally: Tally) -> int:
    """The in-process API with a scripted channel: throttled and uncertain first answers."""
    from notifier.api import Notifier  # noqa: PLC0415
    from notifier.channels.scripted import (  # noqa: PLC0415
        DELIVER,
        LOST_AFTER_COMMIT,
        Channels,
        ScriptedChannel,
        throttle,
    )
    from notifier.domain.intent import Intent  # noqa: PLC0415

    answers = Counter[str]()

    def script(intent: Intent, tries: int) -> Any:
        tally.sent()
        n = int(intent.item_id[1:])
        if tries == 0 and n % 25 == 0:
            answers["throttled"] += 1
            return throttle(0.0)
        if tries == 0 and n % 7 == 0:
            answers["uncertain"] += 1
            return LOST_AFTER_COMMIT
        answers["receipt"] += 1
        return DELIVER

    (work / "notifier.toml").write_text('[channels.hooks]\ntype = "webhook"\nurl = "http://x"\n')
    hooks = ScriptedChannel("hooks", script, idempotent=False, queryable=True)
    api = Notifier.open(work / "receipts.db", config=work / "notifier.toml",
                        channels=Channels(hooks=hooks))  # fmt: skip
    result = api.send(work / "batch.csv", channel="hooks", concurrency=concurrency)
    print(f"answers: {dict(answers)}; result: {getattr(result, 'stop', result)}")
    return sum(answers.values())


def report(tally: Tally, items: int, answers: int, seconds: float) -> None:
    before, during = "before the first send", "sending"
    print(f"{items:,} items, {answers:,} answers, {seconds:.2f} s in all")
    for kind in ("decide", "policy.judge", "gate closed"):
        print(f"\n{kind}: {tally.total(during, kind)} while sending "
              f"({tally.total(during, kind) / answers:.2f} per answer)")  # fmt: skip
        for name, n in tally.by_name(during, kind):
            print(f"  {n:7,}  {name}")
    print(f"\nreads of the run's row before the first send: {tally.total(before, 'run read')}")
    for name, n in tally.by_name(before, "run read"):
        print(f"  {n:7,}  {name}")
    reads = tally.total(during, "run read")
    print(f"reads of the run's row while sending: {reads} ({reads / items:.3f} per item)")
    for name, n in tally.by_name(during, "run read"):
        print(f"  {n:7,}  {name}")
    print(f"\nstatements before the first send: {tally.total(before, 'statement')}")
    total = tally.total(during, "statement")
    print(f"statements while sending: {total:,} ({total / items:.3f} per item)")
    for name, n in tally.by_name(during, "statement"):
        print(f"  {n:7,}  {n / items:6.3f}/item  {name}")


def show_profile(
    profiles: list[tuple[str, cProfile.Profile]], items: int, top: int, sort: str
) -> None:
    """The threads' profiles merged by kind (the main thread; the senders together)."""
    for kind in dict.fromkeys(k for k, _ in profiles):
        ours = [p for k, p in profiles if k == kind]
        out = io.StringIO()
        stats = pstats.Stats(ours[0], stream=out)
        for profile in ours[1:]:
            stats.add(profile)
        stats.sort_stats(sort).print_stats(top)
        print(f"\ncProfile of the {kind} thread(s) on their CPU clock, {items:,} items:")
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=("happy", "mixed", "plain"), default="happy")
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--profile", action="store_true", help="cProfile every thread")
    parser.add_argument("--timers", action="store_true", help="CPU of the committer's blocks")
    parser.add_argument("--sql", action="store_true", help="with --timers: each statement's")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime", help="pstats order: tottime, cumulative")
    args = parser.parse_args()
    start = time.thread_time()
    import notifier.cli  # noqa: F401, PLC0415  (what `notifier send` imports before its work)

    PHASES["start-up (import notifier.cli)"] = time.thread_time() - start
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batch(work / "batch.csv", args.items)
        scenario = {"happy": happy, "mixed": mixed, "plain": plain}[args.scenario]
        start = time.perf_counter()
        # The spies cost CPU of their own: a profiled or timed run goes without them.
        counting = nullcontext() if args.profile or args.timers else spies(tally)
        sql = sql_timers(args.timers and args.sql)
        with profiled(args.profile) as (profiles, cpu), counting, timers(args.timers), sql:
            answers = scenario(work, args.items, args.concurrency, tally)
        seconds = time.perf_counter() - start
        os.chdir(HERE.parent)
    if not (args.profile or args.timers):
        report(tally, args.items, answers, seconds)
    print("\nCPU by thread (ms per item):")
    for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        print(f"  {1000 * seconds / args.items:6.3f}  {name}")
    if args.scenario == "happy":
        print("the main thread by phase (ms per item):")
        for name, seconds in PHASES.items():
            print(f"  {1000 * seconds / args.items:6.3f}  {name}")
    if TIMES:
        print("blocks, inclusive (ms per item):")
        for name, seconds in TIMES.items():
            print(f"  {1000 * seconds / args.items:6.3f}  {name}")
    if SQL_TIMES:
        total = sum(SQL_TIMES.values())
        print(f"SQL statements on the main thread: {1000 * total / args.items:.3f} ms per item")
        for name, seconds in sorted(SQL_TIMES.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {1000 * seconds / args.items:6.3f}  {SQL_COUNTS[name]:6,}  {name}")
    if profiles:
        show_profile(profiles, args.items, args.top, args.sort)


if __name__ == "__main__":
    main()
