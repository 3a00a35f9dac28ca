"""Threads or asyncio for the webhook channel: the same POSTs at the same concurrency, side by
side, against the sandbox in its own process.

- threads: one sync `httpx2.Client` shared by N threads (what the channel does today);
- asyncio: one `httpx2.AsyncClient` driven by N tasks in one event-loop thread.

Each case is a fresh process (its CPU time and peak RSS are its own), sized so that it runs
at least --seconds; the cases alternate, --rounds times, and the median of each is printed.

    python bench/http_clients.py [--seconds 10] [--concurrency 16] [--latency-ms 0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def body(i: int) -> dict[str, Any]:
    return {"to": f"user{i}@example.com", "subject": f"Notice {i}",
            "body": f"Hello user {i}, your report is ready.", "data": {"plan": "team"},
            "run_id": "bench", "item_id": f"b{i}"}  # fmt: skip


def with_threads(url: str, items: int, workers: int) -> None:
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    import httpx2  # noqa: PLC0415

    client = httpx2.Client(trust_env=False, limits=httpx2.Limits(max_connections=workers))
    pid = os.getpid()

    def post(i: int) -> None:
        response = client.post(url, json=body(i), headers={"Idempotency-Key": f"t-{pid}-{i}"})
        response.raise_for_status()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(post, range(items)))
    client.close()


def with_asyncio(url: str, items: int, workers: int) -> None:
    import asyncio  # noqa: PLC0415

    import httpx2  # noqa: PLC0415

    pid = os.getpid()

    async def main() -> None:
        limits = httpx2.Limits(max_connections=workers)
        async with httpx2.AsyncClient(trust_env=False, limits=limits) as client:
            queue = iter(range(items))

            async def worker() -> None:
                for i in queue:  # one shared iterator: each item is taken by one task
                    headers = {"Idempotency-Key": f"a-{pid}-{i}"}
                    response = await client.post(url, json=body(i), headers=headers)
                    response.raise_for_status()

            await asyncio.gather(*(worker() for _ in range(workers)))

    asyncio.run(main())


def child(kind: str, url: str, items: int, workers: int) -> None:
    start = time.perf_counter()
    (with_threads if kind == "threads" else with_asyncio)(url, items, workers)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime,
                      "rss_mb": usage.ru_maxrss / 1024}))  # fmt: skip


def measure(kind: str, url: str, items: int, workers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", kind, "--url", url, "--items", str(items),
         "--concurrency", str(workers)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--url")
    parser.add_argument("--items", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.items, args.concurrency)
        return
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "notifier", "sandbox", "--port", "0",
         "--latency-ms", str(args.latency_ms)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert sandbox.stdout is not None
        url = sandbox.stdout.readline().split()[-1]
        workers = args.concurrency
        probe = measure("threads", url, workers * 20, workers)
        items = max(workers * 20, int(workers * 20 / probe["seconds"] * args.seconds))
        runs: dict[str, list[dict[str, float]]] = {"threads": [], "asyncio": []}
        for _ in range(args.rounds):
            for kind, results in runs.items():
                results.append(measure(kind, url, items, workers))
    finally:
        sandbox.terminate()
        sandbox.wait()
    print(f"{os.cpu_count()} cores; {items:,} POSTs per case, concurrency {workers}, "
          f"receiver latency {args.latency_ms:g} ms; "
          f"median of {args.rounds} fresh processes")  # fmt: skip
    print("| client | items/s | CPU ms/request | peak RSS MB |")
    print("|---|---|---|---|")
    for kind, results in runs.items():
        rate = statistics.median(items / r["seconds"] for r in results)
        cpu = statistics.median(1000 * r["cpu"] / items for r in results)
        rss = statistics.median(r["rss_mb"] for r in results)
        print(f"| {kind} | {rate:,.0f} | {cpu:.3f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
