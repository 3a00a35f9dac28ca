"""Many workers on one PostgreSQL run: 1, 2 and 4 worker processes (concurrency 16 each)
against the sandbox at 100 ms latency, their items/s and the scaling ratio; the same batch
on SQLite with one process for reference; one worker on PostgreSQL against one on SQLite at
20 ms (the median of three turns each); and the plain, non-durable loop (httpx2 in threads,
no database) at the same total concurrency, in the same run.

Items/s are read off the sandbox (its own process): committed deliveries over the time from
the first to the last. Each case plans its batch first (`send --require-approval`, then
`approve`), so only sending is timed, and runs in a fresh PostgreSQL schema.

    python bench/workers.py [--seconds 10] [--db postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import as_installed, measure, start_sandbox, webhook_config, write_batch

CONCURRENCY = 16


def notifier(work: Path, db: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "notifier", "--db", db, *args],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def check(process: subprocess.Popen[str], ok: tuple[int, ...] = (0,)) -> str:
    out, _ = process.communicate()
    if process.returncode not in ok:
        raise SystemExit(f"notifier exited {process.returncode}: {out[-2000:]}")
    return out


def deliveries_per_second(base: str, since: int) -> tuple[int, float]:
    with urllib.request.urlopen(f"{base}/deliveries") as response:  # noqa: S310 (loopback)
        deliveries = json.load(response)[since:]
    stamps = sorted(datetime.fromisoformat(d["committed_at"]) for d in deliveries)
    seconds = (stamps[-1] - stamps[0]).total_seconds()
    return len(stamps), len(stamps) / seconds


def delivered(base: str) -> int:
    with urllib.request.urlopen(f"{base}/stats") as response:  # noqa: S310 (loopback)
        return int(json.load(response)["totals"]["commits"])


@contextmanager
def fresh_schema(server: str) -> Iterator[str]:
    """A schema of its own on `server` for one case, dropped afterwards."""
    schema = "bench_" + os.urandom(4).hex()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    joiner = "&" if "?" in server else "?"
    try:
        yield f"{server}{joiner}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def one_case(url: str, db: str, workers: int, items: int) -> float:
    """Plan `items`, then send them with `workers` processes; items/s at the sandbox."""
    base = url.removesuffix("/notifications")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batch(work / "batch.csv", items)
        webhook_config(work, url)
        planned = check(notifier(work, db, "send", "batch.csv", "--channel", "hooks",
                                 "--run-id", "bench", "--require-approval"))  # fmt: skip
        fingerprint = next(
            line.split()[-1] for line in planned.splitlines() if line.startswith("fingerprint")
        )
        check(notifier(work, db, "approve", "bench", "--fingerprint", fingerprint))
        before = delivered(base)
        started = [
            notifier(
                work,
                db,
                "worker" if db.startswith("postgresql") else "resume",
                "bench",
                "--concurrency",
                str(CONCURRENCY),
            )
            for _ in range(workers)
        ]
        for process in started:
            # A worker that finds nothing left while another still sends leaves with exit 3
            # (the run is not done yet); the deliveries below say whether all went out.
            check(process, ok=(0, 3) if len(started) > 1 else (0,))
        count, rate = deliveries_per_second(base, before)
        if count != items:
            raise SystemExit(f"{count} deliveries for {items} items")
        return rate


def scaling(db: str, seconds: float) -> dict[str, float]:
    """1, 2 and 4 workers on PostgreSQL, SQLite with one, and the plain loop, at 100 ms."""
    results: dict[str, float] = {}
    sandbox, url = start_sandbox(100)
    try:
        per_worker = CONCURRENCY / 0.1  # the most one worker can do at 100 ms
        for workers in (1, 2, 4):
            items = int(per_worker * workers * seconds * 0.8)
            with fresh_schema(db) as schema:
                results[f"pg{workers}"] = rate = one_case(url, schema, workers, items)
            print(f"PostgreSQL, {workers} worker(s), 100 ms: {rate:,.0f} items/s")
        with tempfile.TemporaryDirectory() as tmp:
            items = int(per_worker * seconds * 0.8)
            results["sqlite1"] = one_case(url, str(Path(tmp) / "receipts.db"), 1, items)
        print(f"SQLite, 1 process, 100 ms: {results['sqlite1']:,.0f} items/s")
        for total in (CONCURRENCY, 2 * CONCURRENCY, 4 * CONCURRENCY):
            items = int(total / 0.1 * seconds * 0.8)
            results[f"plain{total}"] = rate = items / measure("plain", url, items, total)["seconds"]
            print(f"plain loop, concurrency {total}, 100 ms: {rate:,.0f} items/s")
    finally:
        sandbox.terminate()
        sandbox.wait()
    return results


def one_worker_at_20ms(db: str, seconds: float) -> dict[str, float]:
    """One worker on PostgreSQL, on SQLite and the plain loop, taken turn about three times
    (the medians: the machine is shared)."""
    sandbox, url = start_sandbox(20)
    try:
        items = int(CONCURRENCY / 0.02 * seconds * 0.8)
        pg, sqlite, plain = [], [], []
        for _ in range(3):
            with fresh_schema(db) as schema:
                pg.append(one_case(url, schema, 1, items))
            with tempfile.TemporaryDirectory() as tmp:
                sqlite.append(one_case(url, str(Path(tmp) / "receipts.db"), 1, items))
            plain.append(items / measure("plain", url, items, CONCURRENCY)["seconds"])
    finally:
        sandbox.terminate()
        sandbox.wait()
    turns = {"PostgreSQL": pg, "SQLite": sqlite, "plain loop": plain}
    print(
        "20 ms, one worker, three turns (items/s):",
        {k: [round(r) for r in v] for k, v in turns.items()},
    )
    return {
        "pg1_20": statistics.median(pg),
        "sqlite1_20": statistics.median(sqlite),
        "plain16_20": statistics.median(plain),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--db",
        default=os.environ.get(
            "NOTIFIER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    as_installed()
    print(f"{os.cpu_count()} cores; concurrency {CONCURRENCY} per worker; >= {args.seconds:g} s")
    results = scaling(args.db, args.seconds) | one_worker_at_20ms(args.db, args.seconds)
    one = results["pg1"]
    print()
    print("| case | items/s | against 1 PostgreSQL worker | against the plain loop |")
    print("|---|---|---|---|")
    for workers in (1, 2, 4):
        rate = results[f"pg{workers}"]
        baseline = results[f"plain{CONCURRENCY * workers}"]
        print(f"| PostgreSQL, {workers} worker(s), 100 ms | {rate:,.0f} | {rate / one:.2f}x | "
              f"{rate / baseline:.2f}x (plain c{CONCURRENCY * workers}) |")  # fmt: skip
    sqlite = results["sqlite1"]
    print(f"| SQLite, 1 process, 100 ms | {sqlite:,.0f} | {sqlite / one:.2f}x | "
          f"{sqlite / results['plain16']:.2f}x |")  # fmt: skip
    print(f"| PostgreSQL, 1 worker, 20 ms | {results['pg1_20']:,.0f} | | "
          f"{results['pg1_20'] / results['plain16_20']:.2f}x |")  # fmt: skip
    print(f"| SQLite, 1 process, 20 ms | {results['sqlite1_20']:,.0f} | | "
          f"{results['sqlite1_20'] / results['plain16_20']:.2f}x |")  # fmt: skip
    print(f"\n4 workers / 1 worker at 100 ms: {results['pg4'] / one:.2f}x (target >= 3.2x)")
    print(f"PostgreSQL / SQLite, one worker at 20 ms: "
          f"{results['pg1_20'] / results['sqlite1_20']:.2f}x (target >= 0.8x)")  # fmt: skip


if __name__ == "__main__":
    main()
