"""The SMTP channel's pool of connections against a plain smtplib loop, on one aiosmtpd relay
(its own process, on 127.0.0.1) that holds every message --latency-ms before its 250.

- plain: N threads, each with its own `smtplib.SMTP` connection, `sendmail` in a loop (not
  durable, no Message-ID, no checks): the ceiling;
- pool: N threads sharing one `SmtpChannel` (its pool gives each a connection of its own);
- notifier send: the real CLI, `--concurrency N`, durable on SQLite (intents, attempts and
  receipts committed around every send).

The cases alternate, --rounds times, in the same run against the same relay; the median
messages/s of each is printed with its ratio to plain.

    python bench/smtp_pool.py [--messages 400] [--concurrency 8] [--latency-ms 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import smtplib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SENDER = "ops@example.com"


# ---------------------------------------------------------------------- the relay


def serve(port: int, latency_s: float) -> None:
    """The relay's process: accept everything, each message held `latency_s`."""
    from aiosmtpd.controller import Controller  # noqa: PLC0415
    from aiosmtpd.smtp import SMTP, Envelope, Session  # noqa: PLC0415

    class Hold:
        async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
            await asyncio.sleep(latency_s)
            return "250 OK"

    controller = Controller(Hold(), hostname="127.0.0.1", port=port)
    controller.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    controller.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------------- the cases


def message(i: int) -> bytes:
    return (
        f"From: {SENDER}\r\nTo: user{i}@example.com\r\nSubject: Notice {i}\r\n\r\n"
        f"Hello user {i}, your report is ready.\r\n"
    ).encode()


def threaded(workers: int, messages: int, send: Callable[[int, Any], object], setup: Any) -> float:
    """Seconds for `workers` threads to send `messages` between them, each thread with
    `setup()` as its own state (or None)."""
    counter = iter(range(messages))
    lock = threading.Lock()

    def work() -> None:
        state = setup() if setup else None
        try:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                send(i, state)
        finally:
            if isinstance(state, smtplib.SMTP):
                state.quit()

    threads = [threading.Thread(target=work) for _ in range(workers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def plain(port: int, workers: int, messages: int) -> float:
    def send(i: int, conn: smtplib.SMTP) -> None:
        conn.sendmail(SENDER, [f"user{i}@example.com"], message(i))

    return threaded(workers, messages, send, lambda: smtplib.SMTP("127.0.0.1", port))


def pool(port: int, workers: int, messages: int) -> float:
    sys.path.insert(0, str(ROOT))
    from notifier.channels.smtp import SmtpChannel  # noqa: PLC0415
    from notifier.domain.intent import Intent, idempotency_key, intent_digest, make_payload  # noqa: PLC0415

    channel = SmtpChannel(
        "mail", {"type": "smtp", "host": "127.0.0.1", "port": port, "sender": SENDER}
    )

    def intent(i: int) -> Intent:
        target = f"user{i}@example.com"
        payload = make_payload(f"Notice {i}", f"Hello user {i}, your report is ready.", {})
        key = idempotency_key("bench", "0123456789abcdef", f"b{i}", target)
        digest = intent_digest("mail", target, payload)
        return Intent("bench", i, f"b{i}", "mail", target, payload, key, digest)

    intents = [intent(i) for i in range(messages)]
    try:
        return threaded(workers, messages, lambda i, _: channel.send(intents[i]), None)
    finally:
        channel.close()


def notifier_send(port: int, workers: int, messages: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "notifier.toml").write_text(
            f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {port}\n'
            f'sender = "{SENDER}"\n'
        )
        with (work / "batch.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["to", "subject", "body"])
            for i in range(messages):
                writer.writerow([f"user{i}@example.com", f"Notice {i}", "Hello"])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = ["send", "batch.csv", "--channel", "mail", "--concurrency", str(workers)]
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "notifier", "--db", "r.db", *args],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - started


CASES: dict[str, Callable[[int, int, int], float]] = {
    "plain smtplib loop": plain,
    "SmtpChannel pool": pool,
    "notifier send (SQLite)": notifier_send,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--relay", type=int, help=argparse.SUPPRESS)  # the relay's process
    options = parser.parse_args()
    if options.relay:
        serve(options.relay, options.latency_ms / 1000)
        return
    port = free_port()
    relay = subprocess.Popen(
        [sys.executable, str(HERE), "--relay", str(port), "--latency-ms", str(options.latency_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert relay.stdout is not None and relay.stdout.readline().strip() == "ready"
        rates: dict[str, list[float]] = {name: [] for name in CASES}
        for _ in range(options.rounds):
            for name, case in CASES.items():
                seconds = case(port, options.concurrency, options.messages)
                rates[name].append(options.messages / seconds)
    finally:
        assert relay.stdin is not None
        relay.stdin.close()
        relay.wait(timeout=30)
    base = statistics.median(rates["plain smtplib loop"])
    print(
        f"{options.messages} messages, concurrency {options.concurrency}, relay latency "
        f"{options.latency_ms:g} ms, median of {options.rounds} rounds"
    )
    print("| case | messages/s | vs plain |\n|---|---|---|")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
