"""Drafting 10,000 rows with `send --compose` through the fake Messages API
(tests/fake_messages.py, on 127.0.0.1, answering at once): one request per row (4 in
flight) against the Message Batches path (chunks of 2,000). Prints, per path, the HTTP
requests the API saw, the batches created, and the wall time from `send` to the run
awaiting approval (drafts stored and frozen; nothing sent).

    PYTHONPATH=. python bench/compose.py [--rows 10000] [--store sqlite|postgresql://…]

The fake answers in microseconds, so the times measure notifier's side (requests, storing
drafts, freezing), not the API's: a real batch takes minutes to an hour to end.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from click.testing import CliRunner  # noqa: E402

from notifier.cli import cli  # noqa: E402
from notifier.content import drafting  # noqa: E402
from tests.fake_messages import FakeBatches  # noqa: E402


def one(path_name: str, rows: int, db: str | None) -> dict[str, object]:
    fake = FakeBatches()
    with tempfile.TemporaryDirectory() as tmp, fake.running():
        work = Path(tmp)
        batch = work / "rows.csv"
        with batch.open("w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow(["id", "to", "name"])
            out.writerows([f"u{i}", f"u{i}@example.com", f"User {i}"] for i in range(rows))
        (work / "brief.txt").write_text("Tell them their plan renews.")
        os.environ.update(
            ANTHROPIC_BASE_URL=fake.url,
            ANTHROPIC_API_KEY="sk-ant-bench",
            NOTIFIER_BATCH_POLL_S="0.05",
        )
        drafting.BATCH_API_ABOVE_ROWS = 10**9  # the synchronous path, unless --batch-api
        extra = ["--batch-api"] if path_name == "batches" else []
        started = time.monotonic()
        result = CliRunner().invoke(
            cli,
            ["--db", db or str(work / "receipts.db"), "send", str(batch), "--compose",
             str(work / "brief.txt"), "--require-approval", *extra],
        )  # fmt: skip
        wall = time.monotonic() - started
        assert result.exit_code == 0, result.output
        return {
            "path": path_name,
            "rows": rows,
            "http_requests": fake.http_calls,
            "batches": len(fake.created()),
            "wall_s": round(wall, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--store", help="a postgresql:// URL (default: an SQLite file)")
    args = parser.parse_args()
    for path_name in ("per-row", "batches"):
        print(one(path_name, args.rows, args.store), flush=True)


if __name__ == "__main__":
    main()
