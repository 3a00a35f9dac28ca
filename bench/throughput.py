"""Throughput, CPU and memory of `notifier send` against a plain, non-durable loop, in one run.

The receiver runs in its own process. By default it is bench/receiver.py (one asyncio
thread, a fixed 201 with a receipt), which spends about a fifth of the sandbox's CPU per
request (`notifier sandbox`: a thread per connection, every body parsed and stored under a
lock); the last column prints it. That is the worse case for notifier: on this 2-core
machine the receiver's CPU is spent on the client's cores, and at 0 ms the sandbox can set the
pace (its ceiling, printed first, has been below the plain loop's rate), so that both clients
wait for it and their items/s ratio is pressed towards 1. With a receiver that costs little,
or one on other cores, each client is bound by its own CPU per item under the GIL, and the
items/s ratio comes close to the inverse of the CPU ratio. The 0 ms, concurrency 16 case is
measured against the sandbox as well, in the same run; `--receiver sandbox` measures every
case against it.

Its ceiling is measured first (a plain loop at high concurrency). Then, for each latency (0
and 20 ms) and concurrency (1 and 16), a plain loop (one httpx2 client with keep-alive, its
pool shared by threads, same concurrency, no database) and notifier's real code path (the
CLI in a fresh process: plan, lease, point A, send, point B) deliver the same number of
items, sized so that each case runs at least --seconds (--plain per-thread gives each thread
a client of its own, --plain no-keepalive a connection per request: the former costs the
same, the latter more, which flatters notifier): at that size the start-up of either
process (imports, and notifier's plan, both counted) is a few per cent of its CPU per item,
not the figure itself. Each measurement is a fresh process, so its CPU time and peak RSS are
its own. Ratios are what to read, each from one run: the machine is shared. The receiver's
own CPU per request is printed too (it runs on the same cores).

Scale: peak RSS of `send` for 10k items; with --million, the time to plan 1M rows, `resume`
start-up (process start to the first request's point A) and `status` on that 1M-item run.
--send-million (slow, ~20 min; nothing else) runs one `send --concurrency 16` over a 1M-row
CSV in one fresh process, plan and send together, and prints its items/s and peak RSS (the
child's own ru_maxrss).

    python bench/throughput.py [--seconds 10] [--rounds 3] [--receiver fast|sandbox]
                               [--plain shared|per-thread|no-keepalive] [--case 0/16] [--million]
    python bench/throughput.py --send-million
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def as_installed() -> None:
    """Measure notifier as `pip install .` leaves it, its modules compiled to bytecode: with
    PYTHONDONTWRITEBYTECODE set (as on some machines) and an editable install, every child
    would compile notifier's sources again at each start (~0.1 s of CPU), while the plain
    loop's httpx2 comes precompiled from site-packages."""
    import compileall  # noqa: PLC0415  (bench set-up only)

    import notifier  # noqa: PLC0415

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    compileall.compile_dir(Path(notifier.__file__).parent, quiet=1)


def write_batch(path: Path, items: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "to", "subject", "body", "plan"])
        for i in range(1, items + 1):
            writer.writerow([f"b{i}", f"user{i}@example.com", f"Notice {i}",
                             f"Hello user {i}, your report is ready.", "team"])  # fmt: skip


# The plain loop's shapes (`--plain`): one client whose keep-alive pool the threads share (what
# the webhook channel does, the default), a client of its own per thread, or a connection per
# request.
PLAIN_SHAPES = ("shared", "per-thread", "no-keepalive")


def plain_http(url: str, items: int, workers: int, shape: str = "shared") -> None:
    """The non-durable baseline: the same POSTs, no intents, no receipts, no database."""
    import httpx2  # noqa: PLC0415  (only the child that measures it pays for the import)

    keepalive = 0 if shape == "no-keepalive" else None
    limits = httpx2.Limits(max_connections=workers, max_keepalive_connections=keepalive)
    shared = httpx2.Client(trust_env=False, limits=limits)
    own = threading.local()

    def client() -> httpx2.Client:
        if shape != "per-thread":
            return shared
        if not hasattr(own, "client"):
            own.client = httpx2.Client(trust_env=False)
        return own.client  # type: ignore[no-any-return]

    def post(i: int) -> None:
        body = {"to": f"user{i}@example.com", "subject": f"Notice {i}",
                "body": f"Hello user {i}, your report is ready.", "data": {"plan": "team"},
                "run_id": "plain", "item_id": f"b{i}"}  # fmt: skip
        key = f"plain-{os.getpid()}-{i}"
        response = client().post(url, json=body, headers={"Idempotency-Key": key})
        response.raise_for_status()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(post, range(1, items + 1)))


def notifier_cli(workdir: Path, args: list[str]) -> None:
    from notifier.cli import cli  # noqa: PLC0415

    os.chdir(workdir)
    try:
        cli.main(args, prog_name="notifier", standalone_mode=False)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise


def child(kind: str, arg: str, items: int, workers: int) -> None:
    start = time.perf_counter()
    if kind.startswith("plain"):
        plain_http(arg, items, workers, kind.removeprefix("plain").lstrip(":") or "shared")
    else:
        args = ["send", "batch.csv", "--channel", "hooks", "--concurrency", str(workers)]
        notifier_cli(Path(arg), args)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime,
                      "rss_mb": usage.ru_maxrss / 1024}))  # fmt: skip


def measure(kind: str, arg: str, items: int, workers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", kind, "--arg", arg, "--items", str(items),
         "--workers", str(workers)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def start_sandbox(latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    return start_receiver("sandbox", latency_ms)


def start_receiver(kind: str, latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    """The receiver in its own process, and its URL: `fast` (bench/receiver.py) or
    `sandbox` (`notifier sandbox`)."""
    command = (
        [sys.executable, str(HERE.parent / "receiver.py")]
        if kind == "fast"
        else [sys.executable, "-m", "notifier", "sandbox", "--port", "0"]
    )
    receiver = subprocess.Popen(
        [*command, "--latency-ms", str(latency_ms)], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    return receiver, receiver.stdout.readline().split()[-1]


def cpu_of(process: subprocess.Popen[str]) -> float:
    """CPU seconds a live child has used so far (Linux: /proc)."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def webhook_config(work: Path, url: str) -> None:
    base = url.removesuffix("/notifications")
    (work / "notifier.toml").write_text(
        f'[channels.hooks]\ntype = "webhook"\nurl = "{url}"\n'
        f'status_url = "{base}/notifications/{{key}}"\nidempotent = true\n'
    )


def case(
    url: str,
    latency_ms: float,
    workers: int,
    seconds: float,
    rounds: int,
    label: str = "",
    plain_kind: str = "plain",
) -> dict[str, Any]:
    """One row: items sized so that the plain loop runs >= `seconds` (notifier, slower,
    runs longer). A short probe includes the process's start-up, so it underestimates the
    rate; the plain run is repeated, larger, until it really lasts that long. With `rounds`
    > 1 the plain loop and notifier take turns that many times and the medians are shown
    (the machine is shared: one turn can land on either side of a target)."""
    probe_items = max(20, workers * 10)
    probe = measure(plain_kind, url, probe_items, workers)
    served = probe_items  # requests the receiver answered in this case
    items = max(workers * 20, int(probe_items / probe["seconds"] * seconds))
    plain = measure(plain_kind, url, items, workers)
    served += items
    while plain["seconds"] < seconds:
        items = int(items * seconds / plain["seconds"] * 1.1)
        plain = measure(plain_kind, url, items, workers)
        served += items
    plains, durables = [plain], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batch(work / "batch.csv", items)
        webhook_config(work, url)
        for turn in range(rounds):
            if turn:
                plains.append(measure(plain_kind, url, items, workers))
                served += items
            for name in ("receipts.db", "receipts.db-wal", "receipts.db-shm"):
                (work / name).unlink(missing_ok=True)  # each turn plans the batch anew
            durables.append(measure("notifier", str(work), items, workers))
            served += items
    p_s, d_s = (statistics.median(m["seconds"] for m in ms) for ms in (plains, durables))
    p_cpu, d_cpu = (statistics.median(m["cpu"] for m in ms) for ms in (plains, durables))
    return {
        "case": f"{latency_ms:g} ms, concurrency {workers}{label}",
        "items": items,
        "plain_rate": items / p_s,
        "notifier_rate": items / d_s,
        "rate_ratio": p_s / d_s,
        "plain_cpu_ms": 1000 * p_cpu / items,
        "notifier_cpu_ms": 1000 * d_cpu / items,
        "cpu_ratio": d_cpu / p_cpu,
        "requests": served,
        "turns": [
            (p["seconds"] / d["seconds"], d["cpu"] / p["cpu"])
            for p, d in zip(plains, durables, strict=True)
        ],
    }


def timed(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "notifier", *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip
    return time.perf_counter() - start, done.returncode


def million(url: str) -> None:
    """Plan 1M rows (stopped right after the first item's point A), then time `resume`
    start-up to the next item's point A, and `status`."""
    rows = 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batch(work / "batch.csv", rows)
        webhook_config(work, url)
        crash_first = {"NOTIFIER_CRASH_AT": "after-intent:1"}
        plan_s, code = timed(["send", "batch.csv", "--channel", "hooks"], work, crash_first)
        print(f"plan 1M rows (to the first point A): {plan_s:6.1f} s  (exit {code})")
        crash_second = {"NOTIFIER_CRASH_AT": "after-intent:2"}
        resume_s, code = timed(["resume"], work, crash_second)
        print(f"resume start-up to the next point A: {resume_s:6.2f} s  (exit {code})")
        status_s, code = timed(["status"], work)
        print(f"status on the 1M-item run:           {status_s:6.2f} s  (exit {code})")


def send_million(url: str) -> None:
    """One `send --concurrency 16` over a 1M-row CSV, plan and send in one fresh process."""
    rows = 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batch(work / "batch.csv", rows)
        webhook_config(work, url)
        result = measure("notifier", str(work), rows, 16)
    print(f"send 1M rows in one process (plan + send, concurrency 16): "
          f"{rows / result['seconds']:,.0f} items/s over {result['seconds']:,.0f} s, "
          f"CPU {1000 * result['cpu'] / rows:.2f} ms/item, "
          f"peak RSS {result['rss_mb']:.0f} MB")  # fmt: skip


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--million", action="store_true", help="plan/resume/status at 1M")
    parser.add_argument("--rounds", type=int, default=1, help="turns per case (medians shown)")
    parser.add_argument(
        "--send-million", action="store_true", help="only: `send` a 1M-row CSV in one process"
    )
    parser.add_argument(
        "--receiver",
        choices=("fast", "sandbox"),
        default="fast",
        help="fast: bench/receiver.py (the worse case, the default); sandbox: notifier sandbox",
    )
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="MS/N",
        help="only this latency/concurrency, e.g. 0/16 (repeatable; default all four)",
    )
    parser.add_argument(
        "--plain",
        choices=PLAIN_SHAPES,
        default="shared",
        help="the plain loop's client: shared (default), per-thread, no-keepalive",
    )
    parser.add_argument("--child")
    parser.add_argument("--arg")
    parser.add_argument("--items", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    return parser.parse_args()


def against(
    kind: str, latency: float, workers: list[int], args: argparse.Namespace, label: str = ""
) -> list[dict[str, Any]]:
    """The cases at `latency` against a receiver of `kind` started for them, each with the
    receiver's own CPU per request; at 0 ms in a full run, the 10k-item RSS and --million."""
    rows = []
    receiver, url = start_receiver(kind, latency)
    try:
        if latency == 0:
            ceiling = measure("plain", url, 4000, 32)
            print(f"{kind} receiver's ceiling (plain loop, concurrency 32, 0 ms): "
                  f"{4000 / ceiling['seconds']:,.0f} items/s")  # fmt: skip
        for n in workers:
            before = cpu_of(receiver)
            plain = f"plain:{args.plain}"
            row = case(url, latency, n, args.seconds, args.rounds, label, plain)
            row["receiver_cpu_ms"] = 1000 * (cpu_of(receiver) - before) / row["requests"]
            rows.append(row)
        if latency == 0 and not label and not args.case:
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                write_batch(work / "batch.csv", 10_000)
                webhook_config(work, url)
                ten_k = measure("notifier", str(work), 10_000, 16)
            print(f"peak RSS of `send --concurrency 16`, 10k items: {ten_k['rss_mb']:.0f} MB")
            if args.million:
                million(url)
    finally:
        receiver.terminate()
        receiver.wait()
    return rows


def table(rows: list[dict[str, Any]], rounds: int) -> None:
    print()
    print("| case | items | plain items/s | notifier items/s | ratio | plain CPU ms/item "
          "| notifier CPU ms/item | CPU ratio | receiver CPU ms/request |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['items']:,} | {r['plain_rate']:,.0f} | "
              f"{r['notifier_rate']:,.0f} | {r['rate_ratio']:.2f}x | {r['plain_cpu_ms']:.2f} | "
              f"{r['notifier_cpu_ms']:.2f} | {r['cpu_ratio']:.2f}x | "
              f"{r['receiver_cpu_ms']:.2f} |")  # fmt: skip
    if rounds > 1:
        print("\nturns (items/s ratio, CPU ratio):")
        for r in rows:
            turns = ", ".join(f"{rate:.2f}x/{cpu:.2f}x" for rate, cpu in r["turns"])
            print(f"- {r['case']}: {turns}")


def main() -> None:
    args = arguments()
    if args.child:
        child(args.child, args.arg, args.items, args.workers)
        return
    as_installed()
    if args.send_million:
        sandbox, url = start_sandbox(0)
        try:
            send_million(url)
        finally:
            sandbox.terminate()
            sandbox.wait()
        return
    cases = [(float(ms), int(n)) for ms, n in (c.split("/") for c in args.case)] or [
        (latency, workers) for latency in (0.0, 20.0) for workers in (1, 16)
    ]
    print(f"{os.cpu_count()} cores; receiver: {args.receiver}; plain loop: {args.plain} client; "
          f">= {args.seconds:g} s per case; fresh process each; {args.rounds} turn(s) per case, "
          "medians")  # fmt: skip
    rows = []
    for latency in sorted({latency for latency, _ in cases}):
        workers = sorted(n for ms, n in cases if ms == latency)
        rows += against(args.receiver, latency, workers, args)
        if latency == 0 and args.receiver == "fast" and 16 in workers:
            # The same case against the sandbox, in the same run: the harnesses' difference.
            rows += against("sandbox", 0, [16], args, ", the sandbox as receiver")
    table(rows, args.rounds)


if __name__ == "__main__":
    main()
