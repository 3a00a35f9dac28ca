"""Export and verify of a large run: seconds and peak memory, each in a fresh process.

Builds a database holding one run of --items rows, sent whole through an in-process
receiver that answers every request at once (the scripted channel; nothing leaves the
machine), under an audit key. Then, each in its own process so that peak RSS is its own:
`notifier export` of the run to a new file, `notifier verify FILE` of that file offline (a
large file's seals checked in a second process beside the replay: the peak shown is the
larger of the two), and `notifier verify RUN` against the database. Next to them, the plain
baseline: the same rows copied with sqlite3 alone into a file, with no seal, manifest or
index.

    python bench/audit.py [--items 1000000] [--db path-or-postgresql-url] [--keep DIR]

With `--plan-only` the run's items are planned and not sent (items and their planned event
only; attempts, receipts and per-item events are then missing from what is measured).
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
from pathlib import Path

KEY = "a bench key"
RUN = "audit-bench"


def generate(path: Path, rows: int) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "to", "subject", "body"])
        for i in range(1, rows + 1):
            writer.writerow([f"c-{i:07d}", f"customer{i}@example.com",
                             f"Invoice INV-{i:07d}", f"Your invoice {i} is ready."])  # fmt: skip


def build(db: str, batch: Path, plan_only: bool) -> dict[str, float]:
    """The run, planned (and sent unless plan_only) under the audit key."""
    from notifier.api import Notifier  # noqa: PLC0415
    from notifier.channels.scripted import Channels, ScriptedChannel, always_deliver  # noqa: PLC0415
    from notifier.config import Config  # noqa: PLC0415

    hooks = {"type": "webhook", "url": "http://127.0.0.1:9/x", "idempotent": True,
             "timeout": 1}  # fmt: skip
    channel = ScriptedChannel("hooks", always_deliver, idempotent=True, queryable=False)
    notifier = Notifier.open(
        db, config=Config(path=None, channels={"hooks": hooks}), channels=Channels(hooks=channel)
    )
    start = time.perf_counter()
    if plan_only:
        notifier.plan(batch, channel="hooks", run_id=RUN)
    else:
        notifier.send(batch, channel="hooks", run_id=RUN, concurrency=16)
    return {"seconds": time.perf_counter() - start}


def child_export(db: str, to: Path) -> dict[str, float]:
    from notifier.api import Notifier  # noqa: PLC0415

    start = time.perf_counter()
    exported = Notifier.open(db).export(RUN, to)
    return {"seconds": time.perf_counter() - start, "rows": sum(exported.rows.values())}


def child_verify_file(path: Path) -> dict[str, float]:
    from notifier.api import Notifier  # noqa: PLC0415

    start = time.perf_counter()
    checked = Notifier.open(path.parent / "absent.db").verify_export(path)
    assert not checked.findings and all(v.verdict.value == "keyed" for v in checked.runs)
    return {"seconds": time.perf_counter() - start}


def child_verify_db(db: str) -> dict[str, float]:
    from notifier.domain.chain import signer_from  # noqa: PLC0415
    from notifier.domain.verify import verify  # noqa: PLC0415
    from notifier.store import Store  # noqa: PLC0415

    start = time.perf_counter()
    store = Store.open(db, readonly=True, audited=True)
    try:
        (verdict,) = verify(store.audit, [RUN], signer_from(os.environ["NOTIFIER_AUDIT_KEY"], None))
    finally:
        store.close()
    assert verdict.verdict.value == "keyed", verdict.findings[:5]
    return {"seconds": time.perf_counter() - start}


def child_plain(db: str, to: Path) -> dict[str, float]:
    """The same rows copied with sqlite3 alone (SQLite source only): the floor."""
    import sqlite3  # noqa: PLC0415

    start = time.perf_counter()
    source = sqlite3.connect(db)
    out = sqlite3.connect(to)
    rows = 0
    for table, query in (
        ("items", "SELECT seq, item_id, target, state, receipt_id FROM items"),
        ("attempts", "SELECT seq, n, started_at, finished_at, outcome FROM attempts"),
        ("events", "SELECT seq_no, at, kind, item_seq, detail FROM events"),
    ):
        cursor = source.execute(query)
        width = len(cursor.description)
        out.execute(f"CREATE TABLE {table} ({', '.join(f'c{i}' for i in range(width))})")
        marks = ", ".join("?" * width)
        while chunk := cursor.fetchmany(2000):
            out.executemany(f"INSERT INTO {table} VALUES ({marks})", chunk)
            rows += len(chunk)
    out.commit()
    return {"seconds": time.perf_counter() - start, "rows": rows}


def in_child(*args: str) -> dict[str, float]:
    """Run this script's --child mode in a fresh process; its figures and peak RSS (MB)."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True, text=True, check=True,
        env={**os.environ, "NOTIFIER_AUDIT_KEY": KEY},
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def child(mode: str, *args: str) -> None:
    figures = {
        "build": lambda: build(args[0], Path(args[1]), args[2] == "plan-only"),
        "export": lambda: child_export(args[0], Path(args[1])),
        "verify-file": lambda: child_verify_file(Path(args[0])),
        "verify-db": lambda: child_verify_db(args[0]),
        "plain": lambda: child_plain(args[0], Path(args[1])),
    }[mode]()
    # The largest process's peak: this one's, or that of a process it started and waited for
    # (verify FILE checks a large file's seals in a second process).
    peaks = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF,
                                                            resource.RUSAGE_CHILDREN))  # fmt: skip
    figures["peak_mb"] = max(peaks) / 1024
    print(json.dumps(figures))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], *sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--db", help="a PostgreSQL URL (default: an SQLite file in --keep)")
    parser.add_argument("--keep", type=Path, help="the directory to work in (kept)")
    parser.add_argument("--plan-only", action="store_true")
    options = parser.parse_args()
    work = options.keep or Path(tempfile.mkdtemp(prefix="audit-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    db = options.db or str(work / "receipts.db")
    batch = work / "batch.csv"
    generate(batch, options.items)
    built = in_child("build", db, str(batch), "plan-only" if options.plan_only else "send")
    print(f"{options.items:,} items {'planned' if options.plan_only else 'sent'} in "
          f"{built['seconds']:.0f} s")  # fmt: skip
    for name, args in (
        ("export", (db, str(work / "audit.db"))),
        ("verify FILE", ("verify-file", str(work / "audit.db"))),
        ("verify RUN", ("verify-db", db)),
    ):
        figures = in_child(*args) if name != "export" else in_child("export", *args)
        print(f"{name:12} {figures['seconds']:7.1f} s  peak {figures['peak_mb']:6.0f} MB")
    if not options.db:
        plain = in_child("plain", db, str(work / "plain.db"))
        print(f"{'plain copy':12} {plain['seconds']:7.1f} s  peak {plain['peak_mb']:6.0f} MB "
              f"({plain['rows']:,} rows, sqlite3 alone)")  # fmt: skip


if __name__ == "__main__":
    main()
