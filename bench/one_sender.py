"""The CPU of one request, on one thread, one request at a time: the webhook channel's send
(`WebhookChannel.send`: the JSON document, the deadline transport, the answer read as a
stream, the receipt read and masked) against a plain `httpx2.Client.post` of the same body,
against bench/receiver.py in its own process. No other thread runs, so no GIL is shared:
the difference is the channel's own work per request. The two alternate, --rounds times.

    python bench/one_sender.py [--requests 4000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
DIGEST = "sha256:" + "0" * 64
CASES = (("plain httpx2.Client.post", "plain"), ("WebhookChannel.send", "channel"))


def plain(url: str, requests: int) -> None:
    import httpx2  # noqa: PLC0415

    client = httpx2.Client(trust_env=False)
    for i in range(requests):
        body = {"to": f"user{i}@example.com", "subject": f"Notice {i}",
                "body": f"Hello user {i}, your report is ready.", "data": {"plan": "team"},
                "run_id": "plain", "item_id": f"b{i}"}  # fmt: skip
        client.post(url, json=body, headers={"Idempotency-Key": f"plain-{i}"}).raise_for_status()


def channel(url: str, requests: int) -> None:
    from notifier.channels.webhook import WebhookChannel  # noqa: PLC0415
    from notifier.domain.intent import Intent  # noqa: PLC0415

    hooks = WebhookChannel("hooks", {"url": url, "idempotent": True})
    for i in range(requests):
        payload = {"subject": f"Notice {i}", "body": f"Hello user {i}, your report is ready.",
                   "data": {"plan": "team"}}  # fmt: skip
        intent = Intent(run_id="r", seq=i, item_id=f"b{i}", channel="hooks",
                        target=f"user{i}@example.com", payload=payload,
                        idempotency_key=f"k-{i}", intent_digest=DIGEST)  # fmt: skip
        hooks.send(intent)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    receiver = subprocess.Popen(
        [sys.executable, str(HERE.parent / "receiver.py")], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    url = receiver.stdout.readline().split()[-1]
    try:
        for _ in range(args.rounds):
            for name, case in CASES:
                start = time.thread_time()
                (plain if case == "plain" else channel)(url, args.requests)
                per = 1e6 * (time.thread_time() - start) / args.requests
                print(f"{per:7.1f} µs of CPU per request  {name}")
    finally:
        receiver.terminate()
        receiver.wait()


if __name__ == "__main__":
    main()
