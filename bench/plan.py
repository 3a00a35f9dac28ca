"""Planning speed and memory on a generated 100k-row batch.

Prints rows/s and peak RSS for planning (validate + intents + one transaction into SQLite)
next to a plain, non-durable loop over the same file (csv.reader + json.dumps of each row),
each measured in its own fresh process so peak RSS is not shared. Then, against the database
that plan made with every item marked sent (each row is compared with what earlier
runs delivered), planning the same file again (every row already delivered: nothing left)
and planning as many new rows (none delivered: all planned).

    python bench/plan.py [--rows 100000] [--db postgresql://…]

With --db, the cases run in a schema of their own on that server, dropped afterwards.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path


def generate(path: Path, rows: int, start: int = 1) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "to", "subject", "body", "first_name", "plan"])
        for i in range(start, start + rows):
            writer.writerow(
                [
                    f"c-{i:07d}",
                    f"customer{i}@example.com",
                    f"Your December invoice INV-{i:07d}",
                    f"Hi Customer {i},\nyour invoice for {i % 97 + 10}.00 EUR is ready.",
                    f"Customer {i}",
                    ("starter", "team", "business")[i % 3],
                ]
            )


def child_plain(batch: Path) -> dict[str, float]:
    start = time.perf_counter()
    with batch.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        n = sum(1 for row in reader if json.dumps(dict(zip(header, row, strict=True))))
    return {"rows": n, "seconds": time.perf_counter() - start}


def child_plan(batch: Path, db: Path) -> dict[str, float]:
    # Imported here so the plain baseline process does not pay for notifier at all.
    from notifier import config  # noqa: PLC0415
    from notifier.api import planning  # noqa: PLC0415
    from notifier.api.env import Env  # noqa: PLC0415
    from notifier.store import parse_target  # noqa: PLC0415

    env = Env(
        target=parse_target(db), config=config.load(None, explicit=False), say=lambda line: None
    )
    start = time.perf_counter()
    plan = planning.plan_batch(env, batch, channel=None, run_id=None)
    planned = time.perf_counter()
    stored = planning.store_plan(env, plan, batch, {"concurrency": 1}, new_run=False)
    if stored.store is not None:
        stored.store.close()
    end = time.perf_counter()
    return {
        "rows": plan.count,
        "planned": stored.prior.left if stored.prior else plan.count,
        "seconds": end - start,
        "validate_s": planned - start,
        "store_s": end - planned,
    }


def mark_all_sent(db: str) -> None:
    """As if every planned item had been delivered (the bench measures planning, not sending
    a million requests): through the store's own connection, one UPDATE each."""
    from notifier.store import Store  # noqa: PLC0415

    store = Store.open(db)
    try:
        store.engine.execute("BEGIN")
        store.engine.execute(
            "INSERT INTO receipts (idempotency_key, intent_digest, receipt_id, source, "
            "recorded_at) SELECT idempotency_key, intent_digest, idempotency_key, 'bench', "
            "updated_at FROM items WHERE state = 'pending'"
        )
        store.engine.execute("UPDATE items SET state = 'sent' WHERE state = 'pending'")
        store.engine.execute("UPDATE runs SET state = 'completed'")
        store.engine.execute("COMMIT")
    finally:
        store.close()


def run_child(kind: str, batch: Path, db: Path | str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--batch", str(batch), "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--child")
    parser.add_argument("--batch", type=Path)
    parser.add_argument("--db")
    args = parser.parse_args()
    if args.child:
        result = (
            child_plain(args.batch)
            if args.child == "plain"
            else child_plan(args.batch, Path(args.db) if "://" not in args.db else args.db)
        )
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    if args.db:
        # Here only: a child measures its own imports, and psycopg is not one of a plan's.
        from workers import fresh_schema  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        batch = Path(tmp) / "batch.csv"
        generate(batch, args.rows)
        size_mb = batch.stat().st_size / 1e6
        db = (
            stack.enter_context(fresh_schema(args.db))
            if args.db
            else str(Path(tmp) / "receipts.db")
        )
        plain = run_child("plain", batch, Path(tmp) / "unused.db")
        plan = run_child("plan", batch, db)
        db_mb = Path(db).stat().st_size / 1e6 if "://" not in db else 0.0
        mark_all_sent(db)
        again = run_child("plan", batch, db)
        fresh = Path(tmp) / "fresh.csv"
        generate(fresh, args.rows, start=args.rows + 1)
        new = run_child("plan", fresh, db)
    print(f"batch: {args.rows} rows, {size_mb:.1f} MB CSV")
    print(
        f"plain loop (csv + json, not durable): {plain['rows'] / plain['seconds']:,.0f} rows/s, "
        f"{plain['seconds']:.2f} s, peak RSS {plain['peak_rss_mb']:.0f} MB"
    )
    print(
        f"notifier plan into an empty database (validate + intents + one transaction): "
        f"{plan['rows'] / plan['seconds']:,.0f} rows/s, {plan['seconds']:.2f} s "
        f"(validate+digest {plan['validate_s']:.2f} s, store {plan['store_s']:.2f} s), "
        f"peak RSS {plan['peak_rss_mb']:.0f} MB, database {db_mb:.0f} MB"
    )
    print(
        f"ratio plan/plain: time x{plan['seconds'] / plain['seconds']:.1f}, "
        f"peak RSS x{plan['peak_rss_mb'] / plain['peak_rss_mb']:.1f}"
    )
    for label, result in (
        ("the same file again, every row already sent", again),
        ("as many new rows, against the rows already sent", new),
    ):
        print(
            f"plan {label}: {result['seconds']:.2f} s (validate+digest "
            f"{result['validate_s']:.2f} s, compare+store {result['store_s']:.2f} s), "
            f"{result['planned']:.0f} planned, peak RSS {result['peak_rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
