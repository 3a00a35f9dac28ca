"""How long SQLite takes to tell, for each pending retried item of a run, whether it may have
been delivered (store/statements/queries.PENDING_KINDS: run start, `report`, settling), read
through the index of disproving events (events_disproof, as the store names it) and through
the index SQLite picks by itself without statistics (events_by_item, every event of the item).

    python bench/disproof.py [--items 100000] [--events 6]

Builds a throwaway database: ITEMS pending items with one uncertain attempt each and EVENTS
events each, one item in ten disproved by a `not_found`. Prints the median of 5 reads each
way and the query plan used."""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time

from notifier.store import Store, statements
from notifier.store.statements import queries

RUN_COLUMNS = "run_id, state, created_at, updated_at, batch_path, fingerprint, channel_snapshot, "
RUN_COLUMNS += "options, contract_version"


def build(path: str, items: int, events: int) -> None:
    Store.open(path, create=True).close()
    conn = sqlite3.connect(path)
    conn.execute(
        f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ('r', 'running', 't', 't', 'b', 'f', '{{}}', "
        "'{}', '1')"
    )
    conn.executemany(
        "INSERT INTO items (run_id, seq, item_id, channel, target, payload, idempotency_key, "
        "intent_digest, state, updated_at, attempts) "
        "VALUES ('r', ?, ?, 'h', 't', '{}', ?, 'd', 'pending', 't', 1)",
        ((i, f"u{i}", f"k{i}") for i in range(1, items + 1)),
    )
    conn.executemany(
        "INSERT INTO attempts (run_id, seq, n, started_at, finished_at, outcome) "
        "VALUES ('r', ?, 1, '2026-01-01', '2026-01-01', 'uncertain')",
        ((i,) for i in range(1, items + 1)),
    )
    kinds = ["start", "ack", "retry", "query", "noted", "other"]
    conn.executemany(
        "INSERT INTO events (run_id, item_seq, seq_no, at, kind, detail) "
        "VALUES ('r', ?, ?, '2026-01-02', ?, ?)",
        (
            (i, i * events + j, "not_found" if j == 0 and i % 10 == 0 else kinds[j % 6], "x" * 500)
            for i in range(1, items + 1)
            for j in range(events)
        ),
    )
    conn.commit()
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=6)
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "disproof.db")
    build(path, args.items, args.events)
    conn = sqlite3.connect(path)
    for index in ("events_by_item (SQLite's own choice)", "events_disproof (named)"):
        hint = "INDEXED BY events_disproof" if index.startswith("events_disproof") else ""
        fragments = {"indexed_items_retried": "INDEXED BY items_retried"}
        text, names = statements.for_sqlite(
            queries.PENDING_KINDS, {**fragments, "indexed_events_disproof": hint}
        )
        bound = [{"run_id": "r"}[name] for name in names]
        plan = [r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + text, bound)]
        times = []
        for _ in range(5):
            started = time.perf_counter()
            conn.execute(text, bound).fetchall()
            times.append(time.perf_counter() - started)
        on_events = [step for step in plan if step.startswith("SEARCH e")]
        print(f"{index}: {statistics.median(times):.3f} s; {on_events}")
    conn.close()
    os.remove(path)


if __name__ == "__main__":
    main()
