"""A test's workspace: its own directory holding one database (a receipts.db file, or a
PostgreSQL schema of its own), its outbox and batch files, and the real CLI run in it
(in-process with CliRunner, or as a subprocess where it must die or be signalled)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from click.testing import CliRunner, Result

from notifier.cli import cli

from .ledger import Forge, Ledger
from .postgres import schema_of

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "batch.csv"
FIXTURES = ROOT / "tests" / "fixtures"
STORES = ("sqlite", "postgres")
# What reading a database that is not there yet (or is being created) raises, on either store.
DB_ERRORS = (sqlite3.Error, psycopg.Error)


def default_sigint() -> None:
    """`preexec_fn` for every process a test starts: SIGINT back to its default, so that a
    test's Ctrl-C reaches the child even when the suite itself runs with SIGINT ignored (a
    background job of a non-interactive shell), whose children would inherit SIG_IGN and,
    being Python, would then install no KeyboardInterrupt handler either."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP: NOTIFIER_FREEZE_AT froze it), from Linux's
    /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()[0] == "T"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Until `condition()` holds, polled every 10 ms at first and every 100 ms at most;
    fails naming `what` after `timeout` seconds (a bound for a hung process, never a guess
    at how long something takes)."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        time.sleep(pause)
        # A condition met soon is seen soon; a long wait polls less, since each look may
        # read the database (the suite's CPU, not its waits, bounds how fast it runs).
        pause = min(pause * 1.5, 0.1)


@dataclass
class Workspace:
    """A directory holding one database (a receipts.db file, or a PostgreSQL schema of its
    own when `url` is set), its outbox and any batch files a test writes."""

    path: Path
    url: str = ""  # the schema's store URL, for a [postgres] test
    # One read-only session for all of a [postgres] test's reads: a session per read (per
    # poll of a wait) made the server start a backend each time.
    _reader: psycopg.Connection[Any] | None = field(default=None, repr=False, compare=False)
    # Every process `popen` started, so that one a failing test left running is killed.
    _children: list[subprocess.Popen[str]] = field(default_factory=list, repr=False, compare=False)

    @property
    def store(self) -> str:
        return "postgres" if self.url else "sqlite"

    @property
    def db(self) -> Path | str:
        """What `--db` gets: the SQLite file's path, or the PostgreSQL URL."""
        return self.url or self.db_file

    @property
    def db_file(self) -> Path:
        """The SQLite file, for a test about the file itself (its bytes, -wal, permissions)."""
        assert not self.url, "an SQLite-only test was given a PostgreSQL workspace"
        return self.path / "receipts.db"

    @property
    def outbox(self) -> Path:
        return self.path / "outbox"

    def invoke(
        self, *args: str, input: str | None = None, env: Mapping[str, str | None] | None = None
    ) -> Result:
        """Run the CLI in-process, as `NOTIFIER_DB=<ws.db> notifier ARGS` (an `env` value of
        None unsets that variable for the command). The database comes from the environment,
        as an operator's shell would give it, so the commands a message suggests read as they
        do there (a `--db` on the command line is repeated in each of them)."""
        return CliRunner().invoke(
            cli, list(args), input=input, env=self._env(env), catch_exceptions=False
        )

    def _env(self, env: Mapping[str, str | None] | None) -> dict[str, str | None]:
        return {"NOTIFIER_DB": str(self.db), **(env or {})}

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the CLI as a real process (needed where it must die or be signalled)."""
        return subprocess.run(
            [sys.executable, "-m", "notifier", *args],
            cwd=self.path,
            env={**os.environ, "NOTIFIER_DB": str(self.db), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,  # the exit status is what most tests assert on
            preexec_fn=default_sigint,
        )

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start the CLI as a real process, its SIGINT deliverable (see default_sigint);
        killed at the end of the test if it is still running then."""
        child = subprocess.Popen(
            [sys.executable, "-m", "notifier", *args],
            cwd=self.path,
            env={**os.environ, "NOTIFIER_DB": str(self.db), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,  # noqa: PLW1509 (one signal() call: no lock, no import)
        )
        self._children.append(child)
        return child

    def write_csv(self, name: str, rows: Sequence[Sequence[str]]) -> Path:
        path = self.path / name
        with path.open("w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows(rows)
        return path

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Read the real database with plain sqlite3 or psycopg, as an operator would
        (read-only: a test must never create the database a worker is about to create).
        `?` parameters on both."""
        if self.url:
            cursor = self._pg_reader().execute(_psycopg_form(sql), params)
            return [tuple(r) for r in cursor]
        conn = sqlite3.connect(f"file:{self.db_file}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    def _pg_reader(self) -> psycopg.Connection[Any]:
        reader = self._reader
        if reader is None or reader.closed or reader.broken:
            # No prepared statements: a long-lived session's prepared `SELECT *` would fail
            # once a test changed the table's columns behind it.
            reader = psycopg.connect(self.url, autocommit=True, prepare_threshold=None)
            reader.execute("SET default_transaction_read_only = on")
            self._reader = reader
        return reader

    def stop_children(self) -> None:
        """Kill what `popen` started and is still running: a test that failed midway, or
        timed out, leaves its worker behind."""
        children, self._children = self._children, []
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            for pipe in (child.stdout, child.stderr):
                if pipe is not None:
                    pipe.close()

    def close(self) -> None:
        """Stop the children, and end the read session, if any (before the test's schema is
        dropped)."""
        try:
            self.stop_children()
        finally:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    @property
    def ledger(self) -> Ledger:
        """The typed read model of this database (support/ledger.py): what tests read."""
        return Ledger(self.query, postgres=bool(self.url))

    @property
    def forge(self) -> Forge:
        """The changes a test makes behind notifier's back on purpose (support/ledger.py)."""
        return Forge(self.write)

    def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Change the database behind notifier's back, as a test that forges a state does."""
        if self.url:
            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute(_psycopg_form(sql), params)
            return
        conn = sqlite3.connect(self.db_file)
        try:
            conn.execute(sql, params)
            conn.commit()
        finally:
            conn.close()

    def has_database(self) -> bool:
        """Whether anything was created yet: the file, or any table in the schema."""
        if not self.url:
            return self.db_file.exists()
        return bool(self.ledger.tables())

    def reset(self) -> None:
        """Start again from no database, in the same workspace."""
        if self.url:
            schema = schema_of(self.url)
            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute(f"DROP SCHEMA {schema} CASCADE")
                pg.execute(f"CREATE SCHEMA {schema}")
            return
        for suffix in ("", "-wal", "-shm"):
            self.path.joinpath(f"receipts.db{suffix}").unlink(missing_ok=True)

    def stored_bytes(self) -> bytes:
        """Every byte of an SQLite workspace's database files (the file, its -wal and -shm),
        for a test that a secret was never written anywhere in them."""
        return b"".join(p.read_bytes() for p in sorted(self.path.glob("receipts.db*")))

    def outbox_documents(self) -> list[dict[str, Any]]:
        if not self.outbox.exists():
            return []
        return [json.loads(p.read_text("utf-8")) for p in sorted(self.outbox.glob("*.json"))]

    def sent_so_far(self) -> int:
        """How many items are sent, 0 while the database is not there yet (a send that was
        just started may still be creating it)."""
        try:
            return self.ledger.state_counts().get("sent", 0)
        except DB_ERRORS:
            return 0

    def sessions_of(self, pid: int) -> int:
        """How many PostgreSQL sessions process `pid` has open (notifier names its sessions
        `notifier[PID]`); 0 on SQLite."""
        if not self.url:
            return 0
        sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = ?"
        return int(self.query(sql, (f"notifier[{pid}]",))[0][0])

    def wait_sessions_ended(self, pid: int) -> None:
        """Until the server has ended every session of the killed process `pid`: what it sent
        before it died (a whole transaction with its COMMIT, say) may still be committed
        until then, after the process itself is gone."""
        wait_for(lambda: self.sessions_of(pid) == 0, f"the sessions of process {pid} ended")

    def load_fixture(self, name: str) -> None:
        """A database written by an earlier version (tests/fixtures/README.md): NAME.db, or
        on PostgreSQL the dump NAME-pg.sql loaded into this workspace's schema, with the
        outbox its runs wrote and a notifier.toml naming that outbox channel."""
        if self.url:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute((FIXTURES / f"{name}-pg.sql").read_text().encode())
            shutil.copytree(FIXTURES / f"{name}-pg.outbox", self.outbox)
        else:
            shutil.copy(FIXTURES / f"{name}.db", self.db_file)
            shutil.copytree(FIXTURES / f"{name}.outbox", self.outbox)
        (self.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')

    def status(self) -> dict[str, Any]:
        result = self.invoke("status", "--json")
        assert result.exit_code == 0, result.output
        data: dict[str, Any] = json.loads(result.output)
        return data


def assert_counters_match_items(ws: Workspace) -> None:
    """After every test: m004's per-run counters equal a count of the item rows, whatever
    moves the test made (so the whole suite checks that no move path skips them)."""
    if ws.url:
        if "run_counts" not in ws.ledger.tables():
            return
    else:
        if not ws.db_file.exists():
            return
        try:
            if not ws.query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_counts'"
            ):
                return
        except sqlite3.DatabaseError:
            return  # a test that damaged or replaced the file on purpose
    kept = ws.ledger.counters()
    counted = {
        (r, s, n) for (r, s), n in Counter((i.run_id, i.state) for i in ws.ledger.items()).items()
    }
    assert kept == counted, f"run_counts drifted from the items: {kept ^ counted}"


def make_rows(n: int, *, start: int = 1) -> list[list[str]]:
    """A header and `n` plain rows addressed to example.com."""
    rows = [["id", "to", "subject", "body", "name"]]
    for i in range(start, start + n):
        rows.append([f"u{i}", f"user{i}@example.com", f"Hello {i}", f"Body of {i}", f"User {i}"])
    return rows


def _psycopg_form(sql: str) -> str:
    """A test's `?` parameters as psycopg's own `%s` (a literal `%` doubled): the tests'
    statements hold no `?` inside a quoted literal."""
    return sql.replace("%", "%%").replace("?", "%s")
