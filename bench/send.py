"""Durable sending against a plain, non-durable loop on the same downstream, in one run.

Downstreams: the sandbox provider (HTTP on 127.0.0.1, started here as its own process) and
the outbox directory. For each, a plain loop does the same requests (or the same atomic file
writes) with no database, no intents, no receipts; notifier does the full protocol (point A
and point B committed with fsync around every window). Each measurement runs in a fresh
process so its peak RSS is its own. Ratios are what to read: the machine is shared and noisy.

    python bench/send.py [--items 2000] [--latency-ms 0]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()


def write_batch(path: Path, items: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "to", "subject", "body", "plan"])
        for i in range(1, items + 1):
            writer.writerow([f"b{i}", f"user{i}@example.com", f"Notice {i}",
                             f"Hello user {i}, your report is ready.", "team"])  # fmt: skip


def plain_http(url: str, items: int, workers: int) -> None:
    import httpx2  # noqa: PLC0415  (only the child that measures it pays for the import)

    client = httpx2.Client(trust_env=False, limits=httpx2.Limits(max_connections=workers))

    def post(i: int) -> None:
        body = {"to": f"user{i}@example.com", "subject": f"Notice {i}",
                "body": f"Hello user {i}, your report is ready.", "data": {"plan": "team"},
                "run_id": "plain", "item_id": f"b{i}"}  # fmt: skip
        response = client.post(url, json=body, headers={"Idempotency-Key": f"plain-{i}"})
        response.raise_for_status()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(post, range(1, items + 1)))


def plain_files(directory: Path, items: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(1, items + 1):
        temp = directory / f".tmp-{i}"
        with temp.open("w", encoding="utf-8") as handle:
            json.dump({"to": f"user{i}@example.com", "subject": f"Notice {i}"}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        temp.rename(directory / f"{i}.json")
        fd = os.open(directory, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def notifier_send(workdir: Path, channel: str, concurrency: int) -> None:
    from notifier.cli import cli  # noqa: PLC0415

    os.chdir(workdir)
    args = ["send", "batch.csv", "--channel", channel, "--concurrency", str(concurrency)]
    try:
        cli.main(args, prog_name="notifier", standalone_mode=False)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise


def child(kind: str, arg: str, items: int, workers: int) -> None:
    start = time.perf_counter()
    if kind == "plain-http":
        plain_http(arg, items, workers)
    elif kind == "plain-files":
        plain_files(Path(arg), items)
    else:
        notifier_send(Path(arg), kind.removeprefix("notifier-"), workers)
    seconds = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": rss_mb}))


def measure(kind: str, arg: str, items: int, workers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", kind, "--arg", arg, "--items", str(items),
         "--workers", str(workers)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def line(label: str, items: int, plain: dict[str, float], durable: dict[str, float]) -> str:
    return (
        f"{label:<34} plain {items / plain['seconds']:8,.0f}/s {plain['rss_mb']:5.0f} MB | "
        f"notifier {items / durable['seconds']:8,.0f}/s {durable['rss_mb']:5.0f} MB | "
        f"time x{durable['seconds'] / plain['seconds']:.2f}, RSS x"
        f"{durable['rss_mb'] / plain['rss_mb']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, default=0)
    parser.add_argument("--child")
    parser.add_argument("--arg")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.arg, args.items, args.workers)
        return
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "notifier", "sandbox", "--port", "0",
         "--latency-ms", str(args.latency_ms)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert sandbox.stdout is not None
        url = sandbox.stdout.readline().split()[-1]
        base = url.removesuffix("/notifications")
        print(f"{args.items} notifications; sandbox latency {args.latency_ms:g} ms; "
              f"{os.cpu_count()} cores")  # fmt: skip
        for workers in (1, 8):
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                write_batch(work / "batch.csv", args.items)
                (work / "notifier.toml").write_text(
                    f'[channels.hooks]\ntype = "webhook"\nurl = "{url}"\n'
                    f'status_url = "{base}/notifications/{{key}}"\nidempotent = true\n'
                )
                plain = measure("plain-http", url, args.items, workers)
                durable = measure("notifier-hooks", str(work), args.items, workers)
                print(line(f"webhook, concurrency {workers}", args.items, plain, durable))
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_batch(work / "batch.csv", args.items)
            plain = measure("plain-files", str(work / "plain-outbox"), args.items, 1)
            durable = measure("notifier-outbox", str(work), args.items, 1)
            print(line("outbox (fsync per file), sequential", args.items, plain, durable))
    finally:
        sandbox.terminate()
        sandbox.wait()


if __name__ == "__main__":
    main()
